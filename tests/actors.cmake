# Actors: placement (the scheduler's capacity view).
add_executable(test_placement test_placement.c)
target_link_libraries(test_placement PRIVATE dsec_actors dsec_backends dsec_common
  PkgConfig::CMOCKA Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME placement COMMAND test_placement)
