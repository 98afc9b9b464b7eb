# sim: the replay simulator (generator statistics, broken traces, record then replay, a 160-node sim cell, jobs and reclaims).
add_executable(test_sim test_sim.c)
target_link_libraries(test_sim PRIVATE dsec_sim dsec_actors dsec_bus dsec_codecs dsec_common
  PkgConfig::CMOCKA Threads::Threads m dsec_warnings dsec_allocator)
add_test(NAME sim COMMAND test_sim)
set_tests_properties(sim PROPERTIES TIMEOUT 120)

# dsec-sim end to end: CLI, a 160-node cell, record beside a replay, replay the recording, the report.
add_test(NAME sim_cli COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/sim_cli.sh $<TARGET_FILE:dsec-sim>)
set_tests_properties(sim_cli PROPERTIES TIMEOUT 120)

# dsec-sim end to end with training jobs: a small cell whose jobs are asked to give room back to a
# rollout burst (every reclaim honoured, none forced, no rollout lost), and the progress bar on and off a terminal.
add_test(NAME sim_jobs_cli COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/sim_cli.sh $<TARGET_FILE:dsec-sim> jobs)
set_tests_properties(sim_jobs_cli PROPERTIES TIMEOUT 90)
