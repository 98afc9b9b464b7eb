# Bus tests: integration tests against a real nats-server started by
# dsec_natsd in a fresh temp dir. One CTest entry per test group.
add_executable(test_bus ${CMAKE_CURRENT_LIST_DIR}/test_bus.c ${CMAKE_CURRENT_LIST_DIR}/bus_kit.c
  ${CMAKE_CURRENT_LIST_DIR}/test_bus_natsd.c ${CMAKE_CURRENT_LIST_DIR}/test_bus_actor.c
  ${CMAKE_CURRENT_LIST_DIR}/test_bus_request.c ${CMAKE_CURRENT_LIST_DIR}/test_bus_conn.c)
target_link_libraries(test_bus PRIVATE dsec_bus dsec_common PkgConfig::CMOCKA dsec_warnings
                      dsec_allocator)
foreach(group natsd actor order request timeout restart drain overflow schema conn)
  add_test(NAME bus_${group} COMMAND test_bus ${group})
  set_tests_properties(bus_${group} PROPERTIES TIMEOUT 120 LABELS bus)
endforeach()

# The JetStream layer registry (bus/layers-js.c).
pkg_check_modules(LIBARCHIVE_JS REQUIRED IMPORTED_TARGET libarchive)
add_executable(test_layers_js ${CMAKE_CURRENT_LIST_DIR}/test_layers_js.c
  ${CMAKE_CURRENT_LIST_DIR}/image_kit.c)
target_link_libraries(test_layers_js PRIVATE dsec_test_fixture dsec_backends dsec_bus dsec_common PkgConfig::CMOCKA PkgConfig::LIBARCHIVE_JS
                      dsec_warnings dsec_allocator)
add_test(NAME layers_jetstream COMMAND test_layers_js)
set_tests_properties(layers_jetstream PROPERTIES TIMEOUT 120 LABELS bus)

# Trace ids carried by handlers and callbacks, and the hop record (bus/trace.c).
add_executable(test_bus_trace ${CMAKE_CURRENT_LIST_DIR}/test_bus_trace.c)
target_link_libraries(test_bus_trace PRIVATE dsec_test_fixture dsec_bus dsec_common PkgConfig::CMOCKA
                      dsec_warnings dsec_allocator)
add_test(NAME bus_trace COMMAND test_bus_trace)
set_tests_properties(bus_trace PROPERTIES TIMEOUT 120 LABELS bus)
