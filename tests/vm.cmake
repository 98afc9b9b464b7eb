# QEMU backends (microvm, vm): real VMs under TCG (KVM when /dev/kvm exists) booting the VM kit
# on a busybox layer built in the test (root: layer mounts; needs qemu-system-x86 and the kit).
add_executable(test_vm test_vm.c)
target_link_libraries(test_vm PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_vm PRIVATE DSEC_VMKIT_DIR="${CMAKE_BINARY_DIR}/vmkit")
add_dependencies(test_vm vmkit)
add_test(NAME vm COMMAND test_vm)
# Boots several VMs (seconds each under TCG) and checks that no QEMU, directory or mount is left.
# without root, QEMU or the kit it exits 77: a skip, not a pass
set_tests_properties(vm PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 RESOURCE_LOCK dsec_container_host)

# A microVM from an imported image (tests/test_container_image.c built for the microvm backend).
pkg_check_modules(LIBARCHIVE_VT REQUIRED IMPORTED_TARGET libarchive)
add_executable(test_microvm_image test_container_image.c image_kit.c)
target_link_libraries(test_microvm_image PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  PkgConfig::LIBARCHIVE_VT Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_microvm_image PRIVATE IMG_VM=1
  DSEC_VMKIT_DIR="${CMAKE_BINARY_DIR}/vmkit")
add_dependencies(test_microvm_image vmkit)
add_test(NAME microvm_image COMMAND test_microvm_image)
set_tests_properties(microvm_image PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  RESOURCE_LOCK dsec_container_host)
# The same from a full VM (the vm type: a q35 machine, firmware and PCI devices).
add_executable(test_vm_image test_container_image.c image_kit.c)
target_link_libraries(test_vm_image PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  PkgConfig::LIBARCHIVE_VT Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_vm_image PRIVATE IMG_VM=1 IMG_Q35=1
  DSEC_VMKIT_DIR="${CMAKE_BINARY_DIR}/vmkit")
add_dependencies(test_vm_image vmkit)
add_test(NAME vm_image COMMAND test_vm_image)
set_tests_properties(vm_image PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  RESOURCE_LOCK dsec_container_host)
