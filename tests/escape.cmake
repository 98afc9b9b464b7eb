# Escape attempts from inside a container sandbox (issue 10, sandbox hardening): each attempt is
# made from a real crun container on a busybox layer and asserted blocked. Root only (77 skips).
add_executable(test_escape test_escape.c)
target_link_libraries(test_escape PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_escape PRIVATE ESCAPE_PROBE_PATH="$<TARGET_FILE:escape_probe>")
add_dependencies(test_escape escape_probe)

# The probe copied into the sandbox: the same source with DSEC_ESCAPE_PROBE, a static program
# (the busybox layer has no libraries), never sanitized, so it issues exactly the system calls
# busybox cannot (raw ioctls, clone flags, the 32-bit entry).
add_executable(escape_probe test_escape.c)
target_compile_definitions(escape_probe PRIVATE DSEC_ESCAPE_PROBE)
target_include_directories(escape_probe PRIVATE ${DSEC_INCL}/backends)
target_link_libraries(escape_probe PRIVATE dsec_warnings)
set_target_properties(escape_probe PROPERTIES POSITION_INDEPENDENT_CODE OFF)
target_link_options(escape_probe PRIVATE -static)
if(DSEC_ANY_SANITIZER)
  target_compile_options(escape_probe PRIVATE -fno-sanitize=all)
  target_link_options(escape_probe PRIVATE -fno-sanitize=all)
endif()

add_test(NAME escape COMMAND test_escape)
# Containers, cgroups under dsec-ct-esctest and loop mounts on this host: never beside the
# container tests, which count what is left after them.
set_tests_properties(escape PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77
  RESOURCE_LOCK dsec_container_host)

# The same attempts under runc: its seccomp, capabilities and masked paths come from the same
# config.json, read by another program.
add_executable(test_escape_runc test_escape.c)
target_link_libraries(test_escape_runc PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_escape_runc PRIVATE ESCAPE_PROBE_PATH="$<TARGET_FILE:escape_probe>"
  ESCAPE_RUNTIME="runc")
add_dependencies(test_escape_runc escape_probe)
add_test(NAME escape_runc COMMAND test_escape_runc)
set_tests_properties(escape_runc PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77
  RESOURCE_LOCK dsec_container_host)
