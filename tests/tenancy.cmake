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

# A node that goes silent: its sandboxes' owners are told they are lost; when it returns it reclaims
# them, so none is orphaned (tests/test_nodeloss.c).
add_executable(test_nodeloss test_nodeloss.c)
target_link_libraries(test_nodeloss PRIVATE dsec_client dsec_actors dsec_test_fixture PkgConfig::CMOCKA
                      dsec_warnings dsec_allocator)
add_test(NAME nodeloss COMMAND test_nodeloss)
set_tests_properties(nodeloss PROPERTIES TIMEOUT 120)

# A scheduler replica's superseded notices: to the cell at once, and again to a node back from a
# silence or a reconnect, in batches, until it answers (tests/test_lost.c).
add_executable(test_lost test_lost.c)
target_link_libraries(test_lost PRIVATE dsec_actors dsec_test_fixture PkgConfig::CMOCKA dsec_warnings
                      dsec_allocator)
add_test(NAME lost_notices COMMAND test_lost)
set_tests_properties(lost_notices PROPERTIES TIMEOUT 60)
