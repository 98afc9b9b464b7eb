# Actors: placement (the scheduler's capacity view).
add_executable(test_placement test_placement.c)
target_link_libraries(test_placement PRIVATE dsec_actors dsec_backends dsec_common
  PkgConfig::CMOCKA Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME placement COMMAND test_placement)

# The cell configuration's fuzz corpus (fuzz/fuzz_config.c), replayed in every build.
add_executable(fuzz_config_replay ${CMAKE_SOURCE_DIR}/fuzz/fuzz_config.c
  ${CMAKE_SOURCE_DIR}/fuzz/replay_main.c)
target_link_libraries(fuzz_config_replay PRIVATE dsec_actors dsec_common dsec_warnings dsec_allocator)
add_test(NAME config_fuzz_corpus COMMAND fuzz_config_replay ${CMAKE_SOURCE_DIR}/fuzz/corpus/config)

# The KV lease of the arbiter and quota pairs, against a real nats-server with JetStream.
add_executable(test_lease test_lease.c)
target_link_libraries(test_lease PRIVATE dsec_actors dsec_test_fixture PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME lease COMMAND test_lease)
set_tests_properties(lease PROPERTIES TIMEOUT 60)

# Admission by delay (actors/admit.c), on a synthetic clock.
add_executable(test_admit test_admit.c)
target_link_libraries(test_admit PRIVATE dsec_actors dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME admit COMMAND test_admit)
