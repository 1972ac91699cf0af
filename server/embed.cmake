# Writes the file IN into the C++ source OUT as a byte array, so that a
# page (server/console.html) ships inside flatkv-server with no step at run
# time: cmake -DIN=<file> -DOUT=<source> -DNAME=<symbol> -P embed.cmake.
# The symbols are flatkv::server::<NAME> (unsigned char, NUL-terminated) and
# <NAME>Size (without the NUL).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR size "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# About 16 bytes a line, so that the generated file stays readable.
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}"
  "// Generated from ${IN} by server/embed.cmake: do not edit.\n"
  "#include <cstddef>\n\n"
  "namespace flatkv::server {\n"
  "extern const unsigned char ${NAME}[] = {\n${bytes}0x00};\n"
  "extern const size_t ${NAME}Size = ${size};\n"
  "}  // namespace flatkv::server\n")
