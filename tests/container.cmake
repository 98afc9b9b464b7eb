# Container backend: real crun containers on overlays of layers built in the test (root: mounts,
# cgroups, btrfs loop image), with the in-sandbox agent.
add_executable(test_container test_container.c)
target_link_libraries(test_container PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME container COMMAND test_container)
# Creates containers, cgroups under dsec-ct-cttest<pid> and loop mounts on this host, and checks
# afterwards that none is left: never two at once (their load and the host's loop devices).
set_tests_properties(container PROPERTIES TIMEOUT 900 RESOURCE_LOCK dsec_container_host)

# Containers end to end through the bus: a cell whose node runs the container backend natively
# on busybox:1 (built by scripts/build-envs.sh --only busybox).
add_executable(test_container_bus test_container_bus.c)
target_link_libraries(test_container_bus PRIVATE dsec_test_fixture dsec_test_fixture_client dsec_client dsec_actors
  PkgConfig::CMOCKA dsec_warnings dsec_allocator)
target_compile_definitions(test_container_bus PRIVATE DSEC_SRC="${CMAKE_SOURCE_DIR}"
  DSEC_CLI="$<TARGET_FILE:dsec>")
add_dependencies(test_container_bus dsec)
add_test(NAME container_bus COMMAND test_container_bus)
set_tests_properties(container_bus PROPERTIES TIMEOUT 300 RESOURCE_LOCK dsec_container_host)

# The same tests on runc (runtime=runc): the core scenarios only, to keep the run short.
add_executable(test_container_runc test_container.c)
target_link_libraries(test_container_runc PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_container_runc PRIVATE CT_RUNTIME="runc")
add_test(NAME container_runc COMMAND test_container_runc)
set_tests_properties(container_runc PROPERTIES TIMEOUT 600 RESOURCE_LOCK dsec_container_host)
# Without root (or busybox-static) the programs exit 77: a skip, not a pass.
set_tests_properties(container container_bus container_runc PROPERTIES SKIP_RETURN_CODE 77)

# dsec image build: Dockerfiles built in real containers of a cell on busybox:1 (the CLI against
# the cell), the results started and checked.
pkg_check_modules(LIBARCHIVE_CT REQUIRED IMPORTED_TARGET libarchive)
add_executable(test_image_build test_image_build.c image_kit.c)
target_link_libraries(test_image_build PRIVATE dsec_test_fixture dsec_test_fixture_client dsec_client dsec_actors
  PkgConfig::CMOCKA PkgConfig::LIBARCHIVE_CT dsec_warnings dsec_allocator)
target_compile_definitions(test_image_build PRIVATE DSEC_SRC="${CMAKE_SOURCE_DIR}"
  DSEC_CLI="$<TARGET_FILE:dsec>")
add_dependencies(test_image_build dsec)
add_test(NAME image_build COMMAND test_image_build)
set_tests_properties(image_build PROPERTIES TIMEOUT 600 RESOURCE_LOCK dsec_container_host
  SKIP_RETURN_CODE 77)

# A container from an imported image (OCI layout written in-process, 12 layers): whiteouts,
# opaque dirs, hard links, setuid, and the image's Env, WorkingDir and USER.
add_executable(test_container_image test_container_image.c image_kit.c)
target_link_libraries(test_container_image PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  PkgConfig::LIBARCHIVE_CT Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME container_image COMMAND test_container_image)
set_tests_properties(container_image PROPERTIES TIMEOUT 300 RESOURCE_LOCK dsec_container_host
  SKIP_RETURN_CODE 77)
