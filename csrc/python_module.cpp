// Makes the compiled library importable as `lucid_assign._C`. Importing it runs the static registrations of
// ops.cpp and the backend files; the module's attributes are the kernels' limits (geometry.h), which the Python layer
// reads from here. Not part of the CMake (LibTorch) build.
#include <Python.h>

#include "geometry.h"

static struct PyModuleDef lucid_module = {PyModuleDef_HEAD_INIT, "_C", "lucid-assign compiled ops", -1, nullptr};

PyMODINIT_FUNC PyInit__C(void) {
  PyObject* m = PyModule_Create(&lucid_module);
  if (m == nullptr) return nullptr;
  if (PyModule_AddIntConstant(m, "MAX_KEYPOINTS", lucid::geom::kMaxKeypoints) < 0 ||
      PyModule_AddIntConstant(m, "MAX_MASK_PIXELS", static_cast<long>(lucid::geom::kMaxMaskPixels)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
