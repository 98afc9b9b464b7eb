# Hardening (CMakeLists.txt): each shipped program's ELF is read by test_hardening for PIE, full
# RELRO, a non-executable stack, stack canaries and, in optimised builds, fortified libc calls.
# Not in the sanitizer builds: they are not what ships, and instrumentation changes the code.
if(NOT DSEC_ANY_SANITIZER)
  add_executable(test_hardening test_hardening.c)
  target_link_libraries(test_hardening PRIVATE dsec_warnings)
  set(hardening_fortify)
  if(DSEC_FORTIFY)
    set(hardening_fortify --fortify)
  endif()
  # name, then test_hardening's arguments before the file
  foreach(entry "dsecd|" "dsec|" "dsec-sim|" "dsec-fn-zygote|" "dsec-fn-python|--lib" "dsec_shared|--lib"
          "dsec-agent|--static;agent-shepherd.c" "dsec-vminit|--static;init.c")
    string(REPLACE "|" ";" entry "${entry}")
    list(POP_FRONT entry target)
    add_test(NAME hardening_${target}
             COMMAND test_hardening ${entry} ${hardening_fortify} $<TARGET_FILE:${target}>)
    set_tests_properties(hardening_${target} PROPERTIES LABELS hardening TIMEOUT 30)
  endforeach()
endif()
