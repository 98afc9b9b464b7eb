# Control plane: journal, config, and the cell end to end against a real nats-server.
foreach(t journal config node_results)
  add_executable(test_${t} test_${t}.c)
  target_link_libraries(test_${t} PRIVATE dsec_actors PkgConfig::CMOCKA dsec_warnings dsec_allocator)
  add_test(NAME ${t} COMMAND test_${t})
endforeach()

add_library(dsec_test_fixture STATIC fixture.c)
target_link_libraries(dsec_test_fixture PUBLIC dsec_bus PRIVATE dsec_warnings)
# Sandbox helpers for tests that drive dsec through libdsec (tests/fixture-client.h).
add_library(dsec_test_fixture_client STATIC fixture-client.c)
target_link_libraries(dsec_test_fixture_client PUBLIC dsec_client PkgConfig::CMOCKA PRIVATE dsec_warnings)

# The network tests' outside namespace (tests/outside.h).
add_library(dsec_test_outside STATIC outside.c)
target_compile_definitions(dsec_test_outside PRIVATE DSEC_SRC="${CMAKE_SOURCE_DIR}")
target_link_libraries(dsec_test_outside PRIVATE dsec_warnings)

add_executable(test_control test_control.c)
target_link_libraries(test_control PRIVATE dsec_client dsec_actors PkgConfig::CMOCKA dsec_warnings
                      dsec_allocator)
target_link_libraries(test_control PRIVATE dsec_test_fixture)
add_test(NAME control COMMAND test_control $<TARGET_FILE:dsecd>)
set_tests_properties(control PROPERTIES TIMEOUT 300)

add_test(NAME cli COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli_test.sh $<TARGET_FILE:dsec> $<TARGET_FILE:dsecd>)
set_tests_properties(cli PROPERTIES TIMEOUT 120)

add_executable(test_preempt test_preempt.c)
target_link_libraries(test_preempt PRIVATE dsec_test_fixture)
target_link_libraries(test_preempt PRIVATE dsec_client dsec_actors PkgConfig::CMOCKA dsec_warnings
                      dsec_allocator)
target_compile_definitions(test_preempt PRIVATE DSEC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_test(NAME preempt COMMAND test_preempt)
set_tests_properties(preempt PROPERTIES TIMEOUT 180)

# The scheduler's admission bound and "overloaded" (issue 37).
add_executable(test_admission test_admission.c)
target_link_libraries(test_admission PRIVATE dsec_test_fixture)
target_link_libraries(test_admission PRIVATE dsec_client dsec_actors PkgConfig::CMOCKA dsec_warnings
                      dsec_allocator)
add_test(NAME admission COMMAND test_admission)
set_tests_properties(admission PROPERTIES TIMEOUT 180)

# Fleet handling: listing a tenant's sandboxes from the nodes, rm by label, per-tenant events.
add_executable(test_fleet test_fleet.c)
target_link_libraries(test_fleet PRIVATE dsec_test_fixture)
target_link_libraries(test_fleet PRIVATE dsec_client dsec_actors PkgConfig::CMOCKA dsec_warnings
                      dsec_allocator)
add_test(NAME control_fleet COMMAND test_fleet $<TARGET_FILE:dsecd>)
set_tests_properties(control_fleet PROPERTIES TIMEOUT 180)

# libdsec paces its creates while the cell sheds them (dsec/pace.h; issue 37): a scheduler the
# test plays sheds past its rate.
add_executable(test_client_pace test_client_pace.c)
target_link_libraries(test_client_pace PRIVATE dsec_test_fixture)
target_link_libraries(test_client_pace PRIVATE dsec_client dsec_actors PkgConfig::CMOCKA
                      dsec_warnings dsec_allocator)
add_test(NAME client_pace COMMAND test_client_pace)
set_tests_properties(client_pace PROPERTIES TIMEOUT 120)
