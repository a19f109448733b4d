# The scheme families (schemes/families.def, one KVQ_SCHEME_FAMILY(folder, Name, kinds...) line
# each): KVQ_SCHEME_FAMILIES lists their folders in order, and kvq_scheme_sources(VAR PART) sets
# VAR to every family's schemes/<folder>/PART, for the library that compiles that part: traits.cpp
# kvq_core, storage.cpp kvq_cache, reads.cpp kvq_reference (README "Architecture").
set(kvq_families_def ${PROJECT_SOURCE_DIR}/schemes/families.def)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${kvq_families_def})
file(STRINGS ${kvq_families_def} kvq_family_lines REGEX "^KVQ_SCHEME_FAMILY\\(")
set(KVQ_SCHEME_FAMILIES "")
foreach(line IN LISTS kvq_family_lines)
  if(NOT line MATCHES "^KVQ_SCHEME_FAMILY\\(([a-z0-9_]+), *([A-Za-z0-9_]+), *[A-Za-z0-9_]")
    message(FATAL_ERROR "schemes/families.def: '${line}' is not "
                        "KVQ_SCHEME_FAMILY(folder, Name, kinds...)")
  endif()
  if(NOT IS_DIRECTORY ${PROJECT_SOURCE_DIR}/schemes/${CMAKE_MATCH_1})
    message(FATAL_ERROR "schemes/families.def: family '${CMAKE_MATCH_1}' has no folder "
                        "schemes/${CMAKE_MATCH_1}/")
  endif()
  list(APPEND KVQ_SCHEME_FAMILIES ${CMAKE_MATCH_1})
endforeach()

function(kvq_scheme_sources var part)
  set(out "")
  foreach(family IN LISTS KVQ_SCHEME_FAMILIES)
    list(APPEND out ${PROJECT_SOURCE_DIR}/schemes/${family}/${part})
  endforeach()
  set(${var} ${out} PARENT_SCOPE)
endfunction()
