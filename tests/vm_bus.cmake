# MicroVMs and VMs end to end through the bus: a cell whose node runs QEMU (TCG without /dev/kvm)
# on busybox:1 (built by scripts/build-envs.sh --only busybox) and the kit in build/<preset>/vmkit.
add_executable(test_vm_bus test_vm_bus.c)
target_link_libraries(test_vm_bus PRIVATE dsec_test_fixture dsec_test_fixture_client dsec_client dsec_actors
  PkgConfig::CMOCKA dsec_warnings dsec_allocator)
target_compile_definitions(test_vm_bus PRIVATE DSEC_SRC="${CMAKE_SOURCE_DIR}"
  DSEC_CLI="$<TARGET_FILE:dsec>")
add_dependencies(test_vm_bus dsec)
add_test(NAME vm_bus COMMAND test_vm_bus)
# without root, QEMU or the kit it exits 77: a skip, not a pass
set_tests_properties(vm_bus PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1200 RESOURCE_LOCK dsec_container_host)
