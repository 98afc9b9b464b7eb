# The malformed-message storm (issue 10): every subject of a running cell
# (2 scheduler replicas, sim nodes, the arbiter) against a real nats-server
# with JetStream; every malformed request answered with an error, the cell
# serving afterwards, no leak under the ASan build.
add_executable(test_storm ${CMAKE_CURRENT_LIST_DIR}/test_storm.c)
target_link_libraries(test_storm PRIVATE dsec_test_fixture dsec_client dsec_actors dsec_codecs_testkit
                      PkgConfig::CMOCKA dsec_warnings dsec_allocator)
add_test(NAME storm COMMAND test_storm)
set_tests_properties(storm PROPERTIES TIMEOUT 300)
