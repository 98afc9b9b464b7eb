# Image pull (issue 32): a real docker-registry on loopback (plain; TLS + htpasswd), skopeo to push,
# an in-test hostile HTTP server, and the `dsec image pull` CLI function; exits 77 when
# docker-registry, skopeo or openssl is missing.
add_executable(test_image_pull test_image_pull.c ${CMAKE_SOURCE_DIR}/tools/image-pull.c
  ${CMAKE_SOURCE_DIR}/tools/layer.c)
target_include_directories(test_image_pull PRIVATE ${DSEC_INCL}/tools)
target_link_libraries(test_image_pull PRIVATE dsec_client dsec_bus dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_image_pull PRIVATE
  IMAGE_PULL_LAYOUT_SH="${CMAKE_CURRENT_SOURCE_DIR}/image_pull_layout.sh")
add_test(NAME image_pull COMMAND test_image_pull)
set_tests_properties(image_pull PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
