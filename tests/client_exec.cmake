# libdsec's streamed exec against a stand-in node on a real nats-server: lost output chunks.
add_executable(test_client_exec test_client_exec.c)
target_link_libraries(test_client_exec PRIVATE dsec_client dsec_actors dsec_test_fixture
                      PkgConfig::CMOCKA dsec_warnings dsec_allocator)
add_test(NAME client_exec COMMAND test_client_exec)
set_tests_properties(client_exec PROPERTIES TIMEOUT 120)
# libdsec's file reads and writes of any size (0 B .. 1 GiB) against a stand-in node.
add_executable(test_client_files test_client_files.c)
target_link_libraries(test_client_files PRIVATE dsec_client dsec_actors dsec_test_fixture
                      PkgConfig::CMOCKA dsec_warnings dsec_allocator)
add_test(NAME client_files COMMAND test_client_files)
set_tests_properties(client_files PROPERTIES TIMEOUT 600)
