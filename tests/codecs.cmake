# codecs: cmocka unit tests, the `dsec decode` CLI, and the fuzz seed corpora
# replayed through the fuzz harnesses (fuzz/ itself is built only with
# DSEC_FUZZ, so the replay builds live here and run in every build).
foreach(part msg json jsonparse record)
  add_executable(test_codecs_${part} test_codecs_${part}.c)
  target_link_libraries(test_codecs_${part} PRIVATE
    dsec_codecs_testkit dsec_codecs dsec_common PkgConfig::CMOCKA dsec_warnings dsec_allocator)
  add_test(NAME codecs_${part} COMMAND test_codecs_${part})
endforeach()

add_executable(test_codecs_cli test_codecs_cli.c)
target_link_libraries(test_codecs_cli PRIVATE
  dsec_codecs_testkit dsec_codecs dsec_common PkgConfig::CMOCKA dsec_warnings dsec_allocator)
add_dependencies(test_codecs_cli dsec)
add_test(NAME codecs_cli
  COMMAND test_codecs_cli $<TARGET_FILE:dsec> ${CMAKE_SOURCE_DIR}/docs/protocol.md)

foreach(harness decode json jsonparse record)
  add_executable(fuzz_${harness}_replay
    ${CMAKE_SOURCE_DIR}/fuzz/fuzz_${harness}.c ${CMAKE_SOURCE_DIR}/fuzz/replay_main.c)
  target_link_libraries(fuzz_${harness}_replay PRIVATE
    dsec_codecs_testkit dsec_codecs dsec_common dsec_warnings dsec_allocator)
  add_test(NAME codecs_fuzz_${harness}_corpus
    COMMAND fuzz_${harness}_replay ${CMAKE_SOURCE_DIR}/fuzz/corpus/${harness})
endforeach()

# Writes the generated part of fuzz/corpus/ (run by hand: fuzz_gen_corpus fuzz/corpus).
add_executable(fuzz_gen_corpus ${CMAKE_SOURCE_DIR}/fuzz/gen_corpus.c)
target_link_libraries(fuzz_gen_corpus PRIVATE
  dsec_codecs_testkit dsec_codecs dsec_common dsec_warnings dsec_allocator)

# The Dockerfile reader of `dsec image build` (tools/dockerfile.c): pure, no root.
add_executable(test_dockerfile test_dockerfile.c ${CMAKE_SOURCE_DIR}/tools/dockerfile.c)
target_include_directories(test_dockerfile PRIVATE ${DSEC_INCL}/tools)
target_link_libraries(test_dockerfile PRIVATE dsec_common PkgConfig::CMOCKA dsec_warnings
  dsec_allocator)
add_test(NAME dockerfile COMMAND test_dockerfile)
