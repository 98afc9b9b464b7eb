# libdsec.so's image calls (dsec/image.h) as an outside C program makes them: the test links
# libdsec.so and nothing else of dsec, so a missing export fails its link. image_kit writes the
# archives and hashes them with common/sha256.c compiled in (libdsec.so keeps its hasher to
# itself). Root (whiteouts are device nodes), else it exits 77; it starts its own nats-server.
pkg_check_modules(LIBARCHIVE_CI REQUIRED IMPORTED_TARGET libarchive)
add_executable(test_client_images test_client_images.c image_kit.c
  ${CMAKE_SOURCE_DIR}/common/sha256.c)
target_include_directories(test_client_images PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(test_client_images PRIVATE dsec_shared PkgConfig::CMOCKA
  PkgConfig::LIBARCHIVE_CI Threads::Threads dsec_warnings)
add_test(NAME client_images COMMAND test_client_images)
set_tests_properties(client_images PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
