# Backends: the typed registry and the sim backend.
add_executable(test_backends test_backends.c)
target_link_libraries(test_backends PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME backends COMMAND test_backends)

# The node's event loop and its fair work queue (backends/loop.c, backends/workq.c).
add_executable(test_loop test_loop.c)
target_link_libraries(test_loop PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME loop COMMAND test_loop)
