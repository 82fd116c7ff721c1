# Runs COMMAND (a list) and passes when it exits non-zero within TIMEOUT seconds and its output
# matches EXPECT. For jobs that must end themselves: a job that hangs fails here, not in ctest.
#   cmake -DCOMMAND="a;b;c" -DEXPECT=regex -DTIMEOUT=20 -P expect_abort.cmake
string(TIMESTAMP start "%s")
execute_process(COMMAND ${COMMAND} TIMEOUT ${TIMEOUT} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
message("exit: ${rc} after ${seconds} s\n--- output ---\n${out}\n--- errors ---\n${err}")
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself within ${TIMEOUT} s: ${rc}")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "the job exited 0; expected a non-zero exit")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not match '${EXPECT}'")
endif()
message("ok: non-zero exit ${rc} in ${seconds} s with the expected message")
