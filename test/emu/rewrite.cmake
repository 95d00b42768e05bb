# Turns one CUDA source into C++ for the emulation build (cmake -DIN=x.cu -DOUT=x.cpp -P rewrite.cmake):
#   name<<<grid, block, smem, stream>>>(args)   ->  name | ::zt_emu::Launch("name", grid, block, smem, stream)(args)
#   extern __shared__ __align__(n) T name[];   ->  ZT_EMU_DYNAMIC_SMEM(T, name);
# Anything else that g++ cannot compile (inline PTX) is behind `#if ZT_EMU` in the source itself.
# A launch or dynamic shared-memory declaration in a form not recognised here stops the build.
file(READ ${IN} src)
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*(<[^<>;()]*>)?)<<<" "\\1 | ::zt_emu::Launch(\"\\1\", " src "${src}")
string(REPLACE ">>>(" ")(" src "${src}")
string(REGEX REPLACE "extern __shared__ (__align__\\([0-9]+\\) )?([A-Za-z_][A-Za-z0-9_ ]*[A-Za-z0-9_]) ([A-Za-z_][A-Za-z0-9_]*)\\[\\];"
       "ZT_EMU_DYNAMIC_SMEM(\\2, \\3);" src "${src}")
foreach(bad "<<<" ">>>" "extern __shared__")
  string(FIND "${src}" "${bad}" pos)
  if(NOT pos EQUAL -1)
    string(SUBSTRING "${src}" ${pos} 120 ctx)
    message(FATAL_ERROR "test/emu/rewrite.cmake: ${IN}: '${bad}' in a form the emulation build does not rewrite: ${ctx}")
  endif()
endforeach()
file(WRITE ${OUT}.tmp "#line 1 \"${IN}\"\n${src}")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
