# Tenants, nested project quotas and owner checks: a cell with two scheduler replicas, sim nodes
# and the quota actor on a real nats-server with JetStream (tests/test_tenancy.c).
add_executable(test_tenancy test_tenancy.c)
target_link_libraries(test_tenancy PRIVATE dsec_client dsec_actors dsec_test_fixture PkgConfig::CMOCKA
                      dsec_warnings dsec_allocator)
add_test(NAME tenancy COMMAND test_tenancy $<TARGET_FILE:dsec>)
set_tests_properties(tenancy PROPERTIES TIMEOUT 300)

# Bus permissions for real: `dsec auth` writes the nats-server configuration, a nats-server runs
# it, and tenants' connections stay inside their own subjects (tests/test_auth.c).
add_executable(test_auth test_auth.c)
target_link_libraries(test_auth PRIVATE dsec_client dsec_actors PkgConfig::CMOCKA dsec_warnings
                      dsec_allocator)
add_test(NAME auth COMMAND test_auth $<TARGET_FILE:dsec>)
set_tests_properties(auth PROPERTIES TIMEOUT 120)
