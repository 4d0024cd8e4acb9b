# The rooms of the library and their order (docs/architecture.md): a room may include its own
# headers and those of the rooms below it, never one above it or beside it.
#   util -> os -> model -> cpu -> data -> proj -> nn -> eval -> train -> api -> tools
# eval/ (the scorer, sessions, the report) is below train/, whose validation runs eval's scorer.
# api/ (the public C API of include/nightlora.h) is over both; tools/ (the CLI) is on top.
set(NL_ROOMS util os model cpu data proj nn eval train api tools)
set(NL_ROOM_ORDER "util -> os -> model -> cpu -> data -> proj -> nn -> eval -> train -> api -> tools")
set(NL_ROOM_RANK_util 0)
set(NL_ROOM_RANK_os 1)
set(NL_ROOM_RANK_model 2)
set(NL_ROOM_RANK_cpu 3)
set(NL_ROOM_RANK_data 4)
set(NL_ROOM_RANK_proj 5)
set(NL_ROOM_RANK_nn 6)
set(NL_ROOM_RANK_eval 7)
set(NL_ROOM_RANK_train 8)
set(NL_ROOM_RANK_api 9)
set(NL_ROOM_RANK_tools 10)

# Why room `from` may not use room `to` ("above it", "beside it"), or "" when it may (its own
# room, one below it, or a name that is no room).
function(nl_room_break from to out)
  set(why "")
  if(NOT from STREQUAL to AND DEFINED NL_ROOM_RANK_${to} AND DEFINED NL_ROOM_RANK_${from})
    if(NL_ROOM_RANK_${to} GREATER NL_ROOM_RANK_${from})
      set(why "above it")
    elseif(NL_ROOM_RANK_${to} EQUAL NL_ROOM_RANK_${from})
      set(why "beside it")
    endif()
  endif()
  set(${out} "${why}" PARENT_SCOPE)
endfunction()

# The rooms a file includes ("room/header.h"), in the order they appear, deduplicated.
function(nl_included_rooms file out)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"[a-z0-9_]+/")
  set(rooms "")
  foreach(l IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([a-z0-9_]+)/.*$" "\\1" r "${l}")
    list(FIND NL_ROOMS "${r}" known)
    if(known GREATER -1)
      list(APPEND rooms "${r}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES rooms)
  set(${out} "${rooms}" PARENT_SCOPE)
endfunction()

# The room a test (or fuzz harness) exercises: the highest room it includes (the public header
# nightlora.h counts as api); tools when it runs the built CLI (NL_CLI) or includes nothing of
# the library. Used as its ctest label.
function(nl_test_room file out)
  file(READ "${file}" text)
  nl_included_rooms("${file}" rooms)
  if(text MATCHES "#[ \t]*include[ \t]*\"nightlora\\.h\"")
    list(APPEND rooms api)
  endif()
  set(best "")
  set(best_rank -1)
  foreach(r IN LISTS rooms)
    if(NL_ROOM_RANK_${r} GREATER best_rank)
      set(best "${r}")
      set(best_rank ${NL_ROOM_RANK_${r}})
    endif()
  endforeach()
  if(best STREQUAL "" OR text MATCHES "NL_CLI")
    set(best tools)
  endif()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()
