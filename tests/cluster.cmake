# cluster.cmake - a multi-host cell on a real 3-server NATS cluster under failures (tests/cluster_test.py; root).
find_program(DSEC_PYTHON3 NAMES python3)
if(DSEC_PYTHON3)
  # cluster: kill -9 of a nats-server, a scheduler, node managers (sim, container, function), the
  # active arbiter; two nodes partitioned and healed. cluster_partition_load: the partition starts
  # mid-load, the case where a placement already sent to a node races its retry elsewhere.
  add_test(NAME cluster COMMAND ${DSEC_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/cluster_test.py
    $<TARGET_FILE:dsec> $<TARGET_FILE:dsecd> ${CMAKE_SOURCE_DIR} failures)
  add_test(NAME cluster_partition_load COMMAND ${DSEC_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/cluster_test.py
    $<TARGET_FILE:dsec> $<TARGET_FILE:dsecd> ${CMAKE_SOURCE_DIR} partition-load)
  # cluster_gateway: two cells, one server each, joined by a NATS gateway: cross-cell fan-out.
  add_test(NAME cluster_gateway COMMAND ${DSEC_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/cluster_test.py
    $<TARGET_FILE:dsec> $<TARGET_FILE:dsecd> ${CMAKE_SOURCE_DIR} gateway)
  # network namespaces, container nodes (cgroups dsec-ct-k1..k3, mounts) and a function-backend
  # node: never beside the other host-wide net, container or function tests
  set_tests_properties(cluster cluster_partition_load cluster_gateway PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77
    RESOURCE_LOCK "dsec_net_host;dsec_function_host;dsec_container_host" ENVIRONMENT PYTHONDONTWRITEBYTECODE=1)
endif()
