# codecs: cmocka unit tests, the `dsec decode` CLI, and the fuzz seed corpora
# replayed through the fuzz harnesses (fuzz/ itself is built only with
# DSEC_FUZZ, so the replay builds live here and run in every build).
foreach(part msg)
  add_executable(test_codecs_${part} test_codecs_${part}.c)
  target_link_libraries(test_codecs_${part} PRIVATE
    dsec_codecs_testkit dsec_codecs dsec_common PkgConfig::CMOCKA dsec_warnings dsec_allocator)
  add_test(NAME codecs_${part} COMMAND test_codecs_${part})
endforeach()

