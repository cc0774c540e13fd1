// Makes the compiled library importable as `lucid_assign._C`. Importing it runs the static registrations of
// ops.cpp and the backend files; the module itself has no attributes. Not part of the CMake (LibTorch) build.
#include <Python.h>

static struct PyModuleDef lucid_module = {PyModuleDef_HEAD_INIT, "_C", "lucid-assign compiled ops", -1, nullptr};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&lucid_module); }
