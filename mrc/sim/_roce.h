/* The RoCE baseline's hosts in C (_roce.c), part of the _simc module. */
#ifndef MRC_SIM_ROCE_H
#define MRC_SIM_ROCE_H
#include <Python.h>

/* Adds RocePacket, RoceConn and RoceHost to module m: 0, or -1 with an exception. */
int roce_add_types(PyObject *m);
/* roce.py's constants as this file has them (a dict), for its check. */
PyObject *roce_consts(void);

#endif
