# Function backend: real calls in sandboxed workers (root: namespaces, mounts, cgroups), and one
# call end to end through the bus (node with backend: native).
add_executable(test_function test_function.c)
target_link_libraries(test_function PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME function COMMAND test_function)
set_tests_properties(function PROPERTIES TIMEOUT 300)

add_executable(test_function_bus test_function_bus.c)
target_link_libraries(test_function_bus PRIVATE dsec_test_fixture dsec_client dsec_actors
  PkgConfig::CMOCKA dsec_warnings dsec_allocator)
add_test(NAME function_bus COMMAND test_function_bus)
set_tests_properties(function_bus PROPERTIES TIMEOUT 120)

# Both tests create namespaces, cgroups and per-slot uids on this host; the
# suite checks afterwards that nothing of its own was left behind, so they
# must not overlap.
set_tests_properties(function function_bus PROPERTIES RESOURCE_LOCK dsec_function_host)

# Calls started with dsec_backend_exec_start on the instance's own loop: 64 in flight at once
# without a thread each, timeouts, streaming and caps, freeing the instance while calls run.
add_executable(test_function_async test_function_async.c)
target_link_libraries(test_function_async PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME function_async COMMAND test_function_async)
set_tests_properties(function_async PROPERTIES TIMEOUT 300 RESOURCE_LOCK dsec_function_host
  SKIP_RETURN_CODE 77)

# Function calls in environments of layers (a local registry built from this host's busybox and
# python3 standard library).
add_executable(test_function_env test_function_env.c)
target_link_libraries(test_function_env PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME function_env COMMAND test_function_env)
set_tests_properties(function_env PROPERTIES TIMEOUT 300 RESOURCE_LOCK dsec_function_host)

# Function sandboxes with a network policy: their calls in the sandbox's namespace of the node's
# containment, against an "outside" namespace (tests/net_outside.py) the test builds itself.
add_executable(test_function_net test_function_net.c)
target_link_libraries(test_function_net PRIVATE dsec_test_outside dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_function_net PRIVATE DSEC_SRC="${CMAKE_SOURCE_DIR}")
add_test(NAME function_net COMMAND test_function_net)
set_tests_properties(function_net PROPERTIES TIMEOUT 300
  RESOURCE_LOCK "dsec_function_host;dsec_net_host")

# The same end to end: a cell (scheduler and a native node with containment) places a create with a
# policy and no type on a function sandbox; its calls reach the outside namespace it allows.
add_executable(test_function_net_bus test_function_net_bus.c)
target_link_libraries(test_function_net_bus PRIVATE dsec_test_fixture dsec_test_outside dsec_client dsec_actors
  PkgConfig::CMOCKA dsec_warnings dsec_allocator)
target_compile_definitions(test_function_net_bus PRIVATE DSEC_SRC="${CMAKE_SOURCE_DIR}"
  DSEC_BIN="$<TARGET_FILE:dsec>")
add_dependencies(test_function_net_bus dsec)
add_test(NAME function_net_bus COMMAND test_function_net_bus)
set_tests_properties(function_net_bus PROPERTIES TIMEOUT 300
  RESOURCE_LOCK "dsec_function_host;dsec_net_host")
# Without root (function_env: or busybox-static, Debian's python3) the programs exit 77: a skip.
set_tests_properties(function function_bus function_env function_net function_net_bus PROPERTIES
  SKIP_RETURN_CODE 77)

# A function call in an imported image's environment (tests/test_container_image.c built for the
# function backend: files and variables, not USER or WorkingDir).
pkg_check_modules(LIBARCHIVE_FT REQUIRED IMPORTED_TARGET libarchive)
add_executable(test_function_image test_container_image.c image_kit.c)
target_link_libraries(test_function_image PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  PkgConfig::LIBARCHIVE_FT Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_function_image PRIVATE IMG_FN=1)
add_test(NAME function_image COMMAND test_function_image)
set_tests_properties(function_image PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
