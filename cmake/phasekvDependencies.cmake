# Finds phasekv's dependencies and papers over Debian bookworm's packaging quirks.
# Used both by the build tree and (installed) by phasekvConfig.cmake.
include(CMakeFindDependencyMacro)

# xsimd for every target; Eigen for phasekv::study only: a host of the engine alone needs none.
find_dependency(xsimd 8.1)
if(NOT TARGET Eigen3::Eigen)
  find_package(Eigen3 3.4 QUIET NO_MODULE)
endif()

# xsimd 8.1's exported target lists a library called "xtl" that nothing provides (it is only
# needed by xtensor integration). Drop it so linking against xsimd does not ask for -lxtl.
if(TARGET xsimd)
  get_target_property(_phasekv_xsimd_libs xsimd INTERFACE_LINK_LIBRARIES)
  if(_phasekv_xsimd_libs)
    list(REMOVE_ITEM _phasekv_xsimd_libs xtl)
    set_target_properties(xsimd PROPERTIES INTERFACE_LINK_LIBRARIES "${_phasekv_xsimd_libs}")
  endif()
  unset(_phasekv_xsimd_libs)
endif()
