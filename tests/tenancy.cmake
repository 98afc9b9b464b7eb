# Tenants, nested project quotas and owner checks: a cell with two scheduler replicas, sim nodes
# and the quota actor on a real nats-server with JetStream (tests/test_tenancy.c).
add_executable(test_tenancy test_tenancy.c)
target_link_libraries(test_tenancy PRIVATE dsec_client dsec_actors dsec_test_fixture PkgConfig::CMOCKA
                      dsec_warnings dsec_allocator)
add_test(NAME tenancy COMMAND test_tenancy $<TARGET_FILE:dsec>)
set_tests_properties(tenancy PROPERTIES TIMEOUT 300)
