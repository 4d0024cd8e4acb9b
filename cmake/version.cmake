# Writes ${OUT} with the git commit of the source tree (and "-dirty" for uncommitted changes),
# rewriting it only when that changes, so the CLI relinks only then. Run at every build.
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY ${SRC} OUTPUT_VARIABLE commit
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT dirty STREQUAL "")
    set(commit "${commit}-dirty")
  endif()
endif()
set(text "#define NL_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
