# Install-time run paths and the MPI flags of moe_ep_mpi.pc.
#
# Installed binaries find the libraries of the same prefix through $ORIGIN, so
# that `prefix/bin/moe_ep_conformance` and programs loading
# `prefix/lib/libmoe_ep_mpi.so` start with no LD_LIBRARY_PATH, wherever the
# prefix is moved (cmake --install --prefix, DESTDIR, copying the tree).
# Paths outside the prefix (MPI, NCCL) are not recorded: they are either
# system paths or the user's business, like for any other program.

# moe_ep_set_relocatable_rpath(<target> <install dir of the target>)
function(moe_ep_set_relocatable_rpath target install_dir)
  if(NOT TARGET ${target})
    return()
  endif()
  if(IS_ABSOLUTE "${install_dir}")
    set(_from "${install_dir}")
  else()
    set(_from "${CMAKE_INSTALL_PREFIX}/${install_dir}")
  endif()
  file(RELATIVE_PATH _to_lib "${_from}" "${CMAKE_INSTALL_FULL_LIBDIR}")
  if(_to_lib STREQUAL "")
    set(_rpath "$ORIGIN")
  else()
    set(_rpath "$ORIGIN/${_to_lib}")
  endif()
  # RUNPATH (new dtags): LD_LIBRARY_PATH can still override it, as users expect.
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "${_rpath}")
  target_link_options(${target} PRIVATE "LINKER:--enable-new-dtags")
endfunction()

# MOE_EP_PC_MPI_CFLAGS / MOE_EP_PC_MPI_LIBS: FindMPI's C flags in pkg-config
# spelling (-I, -D, -L/-l), so that `pkg-config --cflags --libs moe_ep_mpi`
# is all a program calling MPI_Init and the adapter needs.
function(moe_ep_mpi_pkgconfig_flags)
  set(_cflags "")
  foreach(dir ${MPI_C_INCLUDE_DIRS})
    list(APPEND _cflags "-I${dir}")
  endforeach()
  foreach(def ${MPI_C_COMPILE_DEFINITIONS})
    list(APPEND _cflags "-D${def}")
  endforeach()
  list(APPEND _cflags ${MPI_C_COMPILE_OPTIONS})
  set(_libs ${MPI_C_LINK_FLAGS})
  foreach(lib ${MPI_C_LIBRARIES})
    if(lib MATCHES "^(.*)/lib([^/]+)\\.(so|a)$")
      list(APPEND _libs "-L${CMAKE_MATCH_1}" "-l${CMAKE_MATCH_2}")
    else()
      list(APPEND _libs "${lib}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _cflags)
  list(REMOVE_DUPLICATES _libs)
  string(REPLACE ";" " " _cflags "${_cflags}")
  string(REPLACE ";" " " _libs "${_libs}")
  set(MOE_EP_PC_MPI_CFLAGS "${_cflags}" PARENT_SCOPE)
  set(MOE_EP_PC_MPI_LIBS "${_libs}" PARENT_SCOPE)
endfunction()
