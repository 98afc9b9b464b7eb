# Prometheus metrics: a cell with sim nodes on a real nats-server serving GET /metrics; scraped
# over TCP and parsed (tests/test_metrics.c).
add_executable(test_metrics ${CMAKE_CURRENT_LIST_DIR}/test_metrics.c)
target_link_libraries(test_metrics PRIVATE dsec_client dsec_actors dsec_test_fixture PkgConfig::CMOCKA
                      dsec_warnings dsec_allocator)
add_test(NAME metrics COMMAND test_metrics)
set_tests_properties(metrics PROPERTIES TIMEOUT 180)
