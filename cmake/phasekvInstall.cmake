include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(PHASEKV_CMAKE_DIR ${CMAKE_INSTALL_DATADIR}/cmake/phasekv)

install(TARGETS phasekv phasekv_study phasekv_tools EXPORT phasekvTargets)
install(DIRECTORY include/phasekv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT phasekvTargets NAMESPACE phasekv:: DESTINATION ${PHASEKV_CMAKE_DIR})

configure_package_config_file(cmake/phasekvConfig.cmake.in
  ${PROJECT_BINARY_DIR}/phasekvConfig.cmake
  INSTALL_DESTINATION ${PHASEKV_CMAKE_DIR})
# A header-only library works for any architecture: the version file must not check sizeof(void*).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/phasekvConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES
  ${PROJECT_BINARY_DIR}/phasekvConfig.cmake
  ${PROJECT_BINARY_DIR}/phasekvConfigVersion.cmake
  cmake/phasekvDependencies.cmake
  DESTINATION ${PHASEKV_CMAKE_DIR})

# pkg-config, for builds without CMake: `pkg-config --cflags phasekv`. Header-only and
# architecture-independent, so it goes to share/pkgconfig; the prefix is found from the file's
# own place (${pcfiledir}), so `cmake --install --prefix` anywhere gives a working file.
file(RELATIVE_PATH PHASEKV_PC_TO_PREFIX
  ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DATADIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" PHASEKV_PC_TO_PREFIX "${PHASEKV_PC_TO_PREFIX}")
# phasekv.pc is the engine and the tools (xsimd); phasekv-study.pc adds Eigen for the study.
configure_file(cmake/phasekv.pc.in ${PROJECT_BINARY_DIR}/phasekv.pc @ONLY)
configure_file(cmake/phasekv-study.pc.in ${PROJECT_BINARY_DIR}/phasekv-study.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/phasekv.pc ${PROJECT_BINARY_DIR}/phasekv-study.pc
        DESTINATION ${CMAKE_INSTALL_DATADIR}/pkgconfig)
