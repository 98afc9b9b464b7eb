# Protocol conformance (issue 34): every request message of docs/protocol.md
# against a running cell (schedulers, sim nodes, the quota actor) on a real
# nats-server with JetStream; every answer's headers and fields checked
# against the doc's tables (the schemas of codecs/schema.c).
add_executable(test_conformance ${CMAKE_CURRENT_LIST_DIR}/test_conformance.c)
target_link_libraries(test_conformance PRIVATE dsec_test_fixture dsec_client dsec_actors
                      PkgConfig::CMOCKA dsec_warnings dsec_allocator)
add_test(NAME conformance COMMAND test_conformance)
set_tests_properties(conformance PROPERTIES TIMEOUT 300)
