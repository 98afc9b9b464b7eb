# Trace ids end to end and the hop record behind dsec trace, on a real nats-server with JetStream.
add_executable(test_trace test_trace.c)
target_link_libraries(test_trace PRIVATE dsec_client dsec_actors dsec_test_fixture PkgConfig::CMOCKA
                      dsec_warnings dsec_allocator)
add_test(NAME trace COMMAND test_trace)
set_tests_properties(trace PROPERTIES TIMEOUT 180)
