# The Python SDK (sdk/python) against real embedded cells: python3 -m unittest loads the
# libdsec.so of this build and each test module starts its own `dsec up`.
# Only in non-sanitizer builds: Python loading an ASan-instrumented libdsec.so
# would need LD_PRELOAD of libasan (and reports CPython's own leaks); TSan likewise.
if(NOT DSEC_ANY_SANITIZER)
  find_program(DSEC_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT DSEC_PYTHON3)
    find_program(DSEC_PYTHON3 python3)
  endif()
  if(DSEC_PYTHON3)
    set(DSEC_SDK_ENV "PYTHONPATH=${CMAKE_SOURCE_DIR}/sdk/python;DSEC_LIB=$<TARGET_FILE:dsec_shared>;DSEC_BIN=$<TARGET_FILE:dsec>;PYTHONDONTWRITEBYTECODE=1")
    # every sandbox type a default `dsec up` offers (sim), concurrency, errors, trajectories
    add_test(NAME sdk
             COMMAND ${DSEC_PYTHON3} -m unittest discover -s ${CMAKE_SOURCE_DIR}/sdk/python/tests
                     -t ${CMAKE_SOURCE_DIR}/sdk/python/tests -p test_sdk.py -v
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/sdk/python)
    set_tests_properties(sdk PROPERTIES TIMEOUT 180 ENVIRONMENT "${DSEC_SDK_ENV}")
    # "overloaded" through the SDK: Overloaded and its retry_after_ms, libdsec's retry of it,
    # on a cell of its own whose scheduler holds one create
    add_test(NAME sdk_admission
             COMMAND ${DSEC_PYTHON3} -m unittest discover -s ${CMAKE_SOURCE_DIR}/sdk/python/tests
                     -t ${CMAKE_SOURCE_DIR}/sdk/python/tests -p test_admission.py -v
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/sdk/python)
    set_tests_properties(sdk_admission PROPERTIES TIMEOUT 120 ENVIRONMENT "${DSEC_SDK_ENV}")
    # fleet handling: list by label/state/type, two tenants, remove by label, events
    add_test(NAME sdk_fleet
             COMMAND ${DSEC_PYTHON3} -m unittest discover -s ${CMAKE_SOURCE_DIR}/sdk/python/tests
                     -t ${CMAKE_SOURCE_DIR}/sdk/python/tests -p test_fleet.py -v
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/sdk/python)
    set_tests_properties(sdk_fleet PROPERTIES TIMEOUT 120 ENVIRONMENT "${DSEC_SDK_ENV}")
    # dsec.images: import, list, inspect, remove and bad input through libdsec and through the
    # dsec command line (its fallback), the records compared
    add_test(NAME sdk_images
             COMMAND ${DSEC_PYTHON3} -m unittest discover -s ${CMAKE_SOURCE_DIR}/sdk/python/tests
                     -t ${CMAKE_SOURCE_DIR}/sdk/python/tests -p test_images.py -v
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/sdk/python)
    # unittest exits 0 when it skips the class without root: its reason marks the ctest skip
    set_tests_properties(sdk_images PROPERTIES TIMEOUT 120 ENVIRONMENT "${DSEC_SDK_ENV}"
      SKIP_REGULAR_EXPRESSION "needs root \\(image layers are unpacked as root\\)")
    # task images over the debootstrap base made by umoci, pushed by skopeo into docker-registry,
    # pulled through dsec.images and run in containers (the tree is cached in
    # /var/cache/dsec-test: the first run pays for debootstrap from the Debian mirror)
    add_test(NAME sdk_images_debian
             COMMAND ${DSEC_PYTHON3} -m unittest discover -s ${CMAKE_SOURCE_DIR}/sdk/python/tests
                     -t ${CMAKE_SOURCE_DIR}/sdk/python/tests -p test_images_debian.py -v
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/sdk/python)
    # a skipped setUpModule (no root, a missing tool, no mirror) exits 0: its line marks the skip
    set_tests_properties(sdk_images_debian PROPERTIES TIMEOUT 900 ENVIRONMENT "${DSEC_SDK_ENV}"
      SKIP_REGULAR_EXPRESSION "setUpModule \\(test_images_debian\\) \\.\\.\\. skipped")
    # pip install ./sdk/python offline (pyproject's in-tree backend) and import the installed copy
    add_test(NAME sdk_install
             COMMAND ${CMAKE_SOURCE_DIR}/tests/sdk_install.sh ${DSEC_PYTHON3}
                     ${CMAKE_SOURCE_DIR}/sdk/python $<TARGET_FILE:dsec_shared>)
    set_tests_properties(sdk_install PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
    # container, microVM and VM sandboxes: a cell whose node runs crun containers and QEMU on
    # busybox:1 (root; skipped otherwise). Containers, their cgroups and loop mounts share host
    # state with the other container tests: never two at once.
    add_test(NAME sdk_container
             COMMAND ${DSEC_PYTHON3} -m unittest discover -s ${CMAKE_SOURCE_DIR}/sdk/python/tests
                     -t ${CMAKE_SOURCE_DIR}/sdk/python/tests -p test_container.py -v
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/sdk/python)
    # unittest exits 0 when setUpModule skips the module: its reason marks the ctest skip
    set_tests_properties(sdk_container PROPERTIES TIMEOUT 900 RESOURCE_LOCK dsec_container_host
      ENVIRONMENT "${DSEC_SDK_ENV}" SKIP_REGULAR_EXPRESSION "container sandboxes need root")
    # files of 0 B .. 1 GiB written and read through the SDK and `dsec cp`, in sim sandboxes
    # and (as root) function, container and microVM ones
    add_test(NAME sdk_files
             COMMAND ${DSEC_PYTHON3} -m unittest discover -s ${CMAKE_SOURCE_DIR}/sdk/python/tests
                     -t ${CMAKE_SOURCE_DIR}/sdk/python/tests -p test_files.py -v
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/sdk/python)
    set_tests_properties(sdk_files PROPERTIES TIMEOUT 1500 RESOURCE_LOCK dsec_container_host
      ENVIRONMENT "${DSEC_SDK_ENV}")
  endif()
endif()
