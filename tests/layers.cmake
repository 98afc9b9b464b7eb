# Layers: digests, env documents, reproducible builds, the directory registries and the node's
# layer cache (root: loop devices, mounts, chown; it runs in its own mount namespace).
add_executable(test_layers test_layers.c)
target_link_libraries(test_layers PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME layers COMMAND test_layers)
set_tests_properties(layers PROPERTIES TIMEOUT 300)
