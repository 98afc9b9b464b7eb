# Image import (root: whiteouts are device nodes, opaque dirs trusted xattrs): docker-archive,
# OCI layout and OCI archive written in-process, hostile archives, layer reuse, kill -9 midway.
pkg_check_modules(LIBARCHIVE_T REQUIRED IMPORTED_TARGET libarchive)
add_executable(test_image test_image.c image_kit.c)
target_link_libraries(test_image PRIVATE dsec_backends dsec_codecs dsec_common PkgConfig::CMOCKA
  PkgConfig::LIBARCHIVE_T Threads::Threads dsec_warnings dsec_allocator)
add_test(NAME image COMMAND test_image)
set_tests_properties(image PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)

# `dsec image` on an OCI layout made by umoci (skips without umoci or root).
add_test(NAME image_cli COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/image_cli_test.sh $<TARGET_FILE:dsec>)
set_tests_properties(image_cli PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
