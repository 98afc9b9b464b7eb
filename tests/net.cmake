# Network containment: each part's tests (root: they create namespaces, veths, taps and
# nftables tables of their own, and remove them).
foreach(t net_link net_nft net_dns net_guest)
  add_executable(test_${t} test_${t}.c)
  target_link_libraries(test_${t} PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
    Threads::Threads dsec_warnings dsec_allocator)
  add_test(NAME ${t} COMMAND test_${t})
  set_tests_properties(${t} PROPERTIES TIMEOUT 300 RESOURCE_LOCK dsec_net_host)
endforeach()
# Without root these exit 77: a skip, not a pass (net_dns needs no root).
set_tests_properties(net_link net_nft net_guest PROPERTIES SKIP_RETURN_CODE 77)

# End to end through the bus: a cell whose node runs containers under network containment, an
# "outside" namespace with a logging DNS server (tests/net_outside.py), and a static DNS flood
# program copied into a sandbox.
add_executable(net_flood net_flood.c)
target_link_options(net_flood PRIVATE -static)
if(DSEC_ANY_SANITIZER)
  target_compile_options(net_flood PRIVATE -fno-sanitize=all)
  target_link_options(net_flood PRIVATE -fno-sanitize=all)
endif()
add_executable(test_net_bus test_net_bus.c)
target_link_libraries(test_net_bus PRIVATE dsec_test_fixture dsec_test_fixture_client dsec_test_outside dsec_client dsec_actors
  PkgConfig::CMOCKA dsec_warnings dsec_allocator)
target_compile_definitions(test_net_bus PRIVATE DSEC_SRC="${CMAKE_SOURCE_DIR}"
  DSEC_CLI="$<TARGET_FILE:dsec>" DSEC_NET_FLOOD="$<TARGET_FILE:net_flood>")
add_dependencies(test_net_bus dsec net_flood)
add_test(NAME net_bus COMMAND test_net_bus)
# containers (like container_bus) and the node's nftables table: never beside those
set_tests_properties(net_bus PROPERTIES TIMEOUT 600 RESOURCE_LOCK "dsec_container_host;dsec_net_host"
  SKIP_RETURN_CODE 77)

# The resolver's fuzz corpus, replayed through its harness (fuzz/fuzz_net_dns.c) in every build.
add_executable(fuzz_net_dns_replay ${CMAKE_SOURCE_DIR}/fuzz/fuzz_net_dns.c
  ${CMAKE_SOURCE_DIR}/fuzz/replay_main.c)
target_link_libraries(fuzz_net_dns_replay PRIVATE dsec_backends dsec_common dsec_warnings dsec_allocator)
add_test(NAME net_dns_fuzz_corpus COMMAND fuzz_net_dns_replay ${CMAKE_SOURCE_DIR}/fuzz/corpus/net_dns)

# Its upstream path's corpus (fuzz/fuzz_net_dns_upstream.c): hostile answers, replayed in every build.
add_executable(fuzz_net_dns_upstream_replay ${CMAKE_SOURCE_DIR}/fuzz/fuzz_net_dns_upstream.c
  ${CMAKE_SOURCE_DIR}/fuzz/replay_main.c)
target_link_libraries(fuzz_net_dns_upstream_replay PRIVATE dsec_backends dsec_common dsec_warnings
  dsec_allocator)
add_test(NAME net_dns_upstream_fuzz_corpus COMMAND fuzz_net_dns_upstream_replay
  ${CMAKE_SOURCE_DIR}/fuzz/corpus/net_dns_upstream)
# The allowlist algebra without the kernel (no root): ranges, CIDRs, box insertion.
add_executable(test_net_box test_net_box.c)
target_link_libraries(test_net_box PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  dsec_warnings dsec_allocator)
add_test(NAME net_box COMMAND test_net_box)
