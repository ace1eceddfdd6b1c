
# tuner TU hook (what the render stage appends to ggml-cuda's CMakeLists.txt)
if (GGML_TUNER_TU_DIR)
    set_source_files_properties(${TOY_TU} PROPERTIES COMPILE_OPTIONS "-include;${GGML_TUNER_TU_DIR}/fattn.h")
endif()
