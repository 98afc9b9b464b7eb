# The Python SDK (sdk/python) against a real embedded cell: python3 -m unittest
# loads the libdsec.so of this build and starts its own `dsec up`.
# Only in non-sanitizer builds: Python loading an ASan-instrumented libdsec.so
# would need LD_PRELOAD of libasan (and reports CPython's own leaks).
if(NOT DSEC_SANITIZE)
  find_program(DSEC_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT DSEC_PYTHON3)
    find_program(DSEC_PYTHON3 python3)
  endif()
  if(DSEC_PYTHON3)
    add_test(NAME sdk
             COMMAND ${DSEC_PYTHON3} -m unittest discover -s ${CMAKE_SOURCE_DIR}/sdk/python/tests
                     -t ${CMAKE_SOURCE_DIR}/sdk/python/tests -v
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/sdk/python)
    set_tests_properties(sdk PROPERTIES
      TIMEOUT 180
      ENVIRONMENT "PYTHONPATH=${CMAKE_SOURCE_DIR}/sdk/python;DSEC_LIB=$<TARGET_FILE:dsec_shared>;DSEC_BIN=$<TARGET_FILE:dsec>;PYTHONDONTWRITEBYTECODE=1")
  endif()
endif()
