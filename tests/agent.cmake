# The in-sandbox agent for real: dsec-agent started with --listen in a temp dir, driven through
# the node-side client (commands, users, timeouts, streaming, files, bad frames, reaping).
add_executable(test_agent test_agent.c)
target_link_libraries(test_agent PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_agent PRIVATE DSEC_AGENT_PATH="$<TARGET_FILE:dsec-agent>")
add_dependencies(test_agent dsec-agent)
add_test(NAME agent COMMAND test_agent)
set_tests_properties(agent PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)

# The agent client's fuzz corpus (fuzz/fuzz_agent_client.c: forged answers from a hostile agent),
# replayed in every build.
add_executable(fuzz_agent_client_replay ${CMAKE_SOURCE_DIR}/fuzz/fuzz_agent_client.c
  ${CMAKE_SOURCE_DIR}/fuzz/replay_main.c)
target_link_libraries(fuzz_agent_client_replay PRIVATE dsec_backends dsec_common Threads::Threads
  dsec_warnings dsec_allocator)
add_test(NAME agent_client_fuzz_corpus
  COMMAND fuzz_agent_client_replay ${CMAKE_SOURCE_DIR}/fuzz/corpus/agent_client)

# The agent's own fuzz corpus (fuzz/fuzz_agent.c: a hostile client's byte stream against the
# agent's frame reader and request decoders), replayed in every build. It chroots: root only
# (77 = skipped otherwise).
get_property(agent_parts GLOBAL PROPERTY DSEC_AGENT_PARTS)
add_executable(fuzz_agent_replay ${CMAKE_SOURCE_DIR}/fuzz/fuzz_agent.c ${agent_parts}
  ${CMAKE_SOURCE_DIR}/fuzz/replay_main.c)
target_compile_definitions(fuzz_agent_replay PRIVATE DSEC_AGENT_FUZZ=1)
target_include_directories(fuzz_agent_replay PRIVATE ${DSEC_INCL}/backends)
target_link_libraries(fuzz_agent_replay PRIVATE dsec_common Threads::Threads dsec_warnings
  dsec_allocator)
add_test(NAME agent_fuzz_corpus COMMAND fuzz_agent_replay ${CMAKE_SOURCE_DIR}/fuzz/corpus/agent)
set_tests_properties(agent_fuzz_corpus PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)

# dsec-agent --watch: a directory's changes as JSON lines (a sandbox's watcher, agent-watch.c).
add_executable(test_agent_watch test_agent_watch.c)
target_link_libraries(test_agent_watch PRIVATE PkgConfig::CMOCKA dsec_warnings)
target_compile_definitions(test_agent_watch PRIVATE DSEC_AGENT_PATH="$<TARGET_FILE:dsec-agent>")
add_dependencies(test_agent_watch dsec-agent)
add_test(NAME agent_watch COMMAND test_agent_watch)
set_tests_properties(agent_watch PROPERTIES TIMEOUT 60)
