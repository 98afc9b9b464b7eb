# The in-sandbox agent for real: dsec-agent started with --listen in a temp dir, driven through
# the node-side client (commands, users, timeouts, streaming, files, bad frames, reaping).
add_executable(test_agent test_agent.c)
target_link_libraries(test_agent PRIVATE dsec_backends dsec_common PkgConfig::CMOCKA
  Threads::Threads dsec_warnings dsec_allocator)
target_compile_definitions(test_agent PRIVATE DSEC_AGENT_PATH="$<TARGET_FILE:dsec-agent>")
add_dependencies(test_agent dsec-agent)
add_test(NAME agent COMMAND test_agent)
set_tests_properties(agent PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
