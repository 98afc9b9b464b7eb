# Backends: the typed registry and the sim backend.
add_executable(test_backends test_backends.c)
target_link_libraries(test_backends PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME backends COMMAND test_backends)
