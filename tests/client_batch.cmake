# libdsec's batched creates (dsec_cq_create_batch) against a real nats-server and cell.
add_executable(test_client_batch test_client_batch.c)
target_link_libraries(test_client_batch PRIVATE dsec_client dsec_actors dsec_test_fixture
                      PkgConfig::CMOCKA dsec_warnings dsec_allocator)
add_test(NAME client_batch COMMAND test_client_batch)
set_tests_properties(client_batch PROPERTIES TIMEOUT 120)
