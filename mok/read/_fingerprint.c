/* The memory facts of many tensors in one C loop: what mok.read.memory reads of every tensor a
 * view depends on (address, storage size and offset, dtype, device, sizes, strides), without a
 * Python call per fact. A checked refresh of 256 experts compares a thousand tensors; through
 * Python each fact is a pass of its own.
 *
 * It needs no torch headers and no compiler at run time: torch's stable C shim (the aoti_torch_*
 * functions libtorch exports for compiled models, declared in
 * torch/csrc/inductor/aoti_torch/c/shim.h) reads the facts, found by address in the loaded
 * libtorch (mok/read/fingerprint.py passes the addresses in), and a tensor's TensorImpl comes from
 * its public ``_cdata``. An AtenTensorHandle is an ``at::Tensor*``, and an at::Tensor is one
 * pointer to its TensorImpl (an intrusive_ptr), so the address of a variable holding the
 * TensorImpl pointer is a handle; the getters only read through it.
 *
 * Where init() recognises how a tensor object holds its at::Tensor and a TensorImpl its storage
 * (checked on probe tensors against their public ``_cdata`` and ``untyped_storage()._cdata``), it
 * reads both directly: the record then names each tensor's storage itself, so a storage whose
 * object the caller keeps alive is known unchanged without asking its size.
 *
 * Where this module is not built, or the shim lacks a function, mok.read.memory does the same in
 * Python; tests run both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef int32_t (*get_ptr_fn)(void *, void **);
typedef int32_t (*get_i64_fn)(void *, int64_t *);
typedef int32_t (*get_i32_fn)(void *, int32_t *);
typedef int32_t (*get_arr_fn)(void *, int64_t **);
typedef size_t (*elem_size_fn)(int32_t);

static get_ptr_fn get_data_ptr;
static get_i64_fn get_storage_size, get_storage_offset, get_dim;
static get_i32_fn get_dtype, get_device_type, get_device_index;
static get_arr_fn get_sizes, get_strides;
static elem_size_fn dtype_element_size;
static PyObject *cdata_descr; /* torch._C.TensorBase._cdata, a getset descriptor */
static PyTypeObject *tensor_type; /* torch._C.TensorBase */
/* Where a tensor object holds its at::Tensor (THPVariable's ``cdata``, right after the object's
 * head in the torch releases init() recognises), found by init() on probe tensors against their
 * ``_cdata``; -1: unknown, read ``_cdata`` instead. */
static Py_ssize_t cdata_offset = -1;
/* Where a TensorImpl holds its StorageImpl pointer (its ``storage_``), found by init() on probe
 * tensors against their ``untyped_storage()._cdata``; -1: unknown, the record holds 0 there and
 * the caller compares storage sizes itself. */
static Py_ssize_t storage_in_impl = -1;

#define MAX_DIM 16
#define HEAD 7 /* data_ptr, storage nbytes, storage offset, dtype, device, StorageImpl, dim */
#define MAX_WORDS (HEAD + 2 * MAX_DIM)

/* The words of one tensor into ``out``; their count, or -1 with a Python error set. ``end``: the
 * byte past the last one the tensor spans from its storage's start (0 when it has no element). */
static Py_ssize_t facts(PyObject *tensor, int64_t *out, int64_t *end) {
    void *impl = NULL, *handle;
    if (cdata_offset >= 0) {
        if (!PyObject_TypeCheck(tensor, tensor_type)) {
            PyErr_Format(PyExc_TypeError, "expected a tensor; found %s", Py_TYPE(tensor)->tp_name);
            return -1;
        }
        handle = (char *)tensor + cdata_offset; /* the at::Tensor itself: its one word is the TensorImpl */
        impl = *(void **)handle;
    } else {
        PyObject *cdata = Py_TYPE(cdata_descr)->tp_descr_get(cdata_descr, tensor, (PyObject *)Py_TYPE(tensor));
        if (cdata == NULL)
            return -1;
        impl = PyLong_AsVoidPtr(cdata);
        Py_DECREF(cdata);
        if (impl == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "expected a tensor; found one without a TensorImpl");
            return -1;
        }
        handle = &impl;
    }
    void *data = NULL;
    int64_t nbytes = 0, offset = 0, dim = 0, *sizes = NULL, *strides = NULL;
    int32_t dtype = 0, device_type = 0, device_index = 0;
    if (get_data_ptr(handle, &data) || get_storage_size(handle, &nbytes) || get_storage_offset(handle, &offset) ||
        get_dtype(handle, &dtype) || get_device_type(handle, &device_type) ||
        get_device_index(handle, &device_index) || get_dim(handle, &dim)) {
        PyErr_SetString(PyExc_TypeError, "expected a tensor with memory of its own; torch could not read it");
        return -1;
    }
    if (dim > MAX_DIM) {
        PyErr_Format(PyExc_TypeError, "expected a tensor of at most %d dimensions; found %lld", MAX_DIM, (long long)dim);
        return -1;
    }
    if (get_sizes(handle, &sizes) || get_strides(handle, &strides)) {
        PyErr_SetString(PyExc_TypeError, "expected a strided tensor; torch could not read its sizes or strides");
        return -1;
    }
    out[0] = (int64_t)(intptr_t)data;
    out[1] = nbytes;
    out[2] = offset;
    out[3] = dtype;
    out[4] = ((int64_t)device_type << 32) | (uint32_t)device_index;
    out[5] = storage_in_impl >= 0 ? (int64_t)(intptr_t) * (void **)((char *)impl + storage_in_impl) : 0;
    out[6] = dim;
    int64_t span = 1; /* elements from the first to the last, plus one */
    for (int64_t i = 0; i < dim; i++) {
        out[HEAD + i] = sizes[i];
        out[HEAD + dim + i] = strides[i];
        if (sizes[i] == 0)
            span = 0;
        else if (span)
            span += (sizes[i] - 1) * strides[i];
    }
    *end = span ? (offset + span) * (int64_t)dtype_element_size(dtype) : 0;
    return HEAD + 2 * dim;
}

static PyObject *not_ready(void) {
    PyErr_SetString(PyExc_RuntimeError, "mok.read._fingerprint: init() was not called");
    return NULL;
}

/* The offset in every probe where a pointer equal to its ``_cdata`` (its TensorImpl) lies: at the
 * object's head (THPVariable holding an at::Tensor) or one word on (a MaybeOwned<at::Tensor>,
 * whose flag comes first); -1 where neither holds for every probe. */
static Py_ssize_t find_cdata_offset(PyObject *probes) {
    const Py_ssize_t candidates[2] = {sizeof(PyObject), sizeof(PyObject) + sizeof(void *)};
    for (int c = 0; c < 2; c++) {
        int all = PyList_GET_SIZE(probes) > 0;
        for (Py_ssize_t i = 0; all && i < PyList_GET_SIZE(probes); i++) {
            PyObject *probe = PyList_GET_ITEM(probes, i);
            if (!PyObject_TypeCheck(probe, tensor_type))
                return -1;
            PyObject *cdata = Py_TYPE(cdata_descr)->tp_descr_get(cdata_descr, probe, (PyObject *)Py_TYPE(probe));
            if (cdata == NULL) {
                PyErr_Clear();
                return -1;
            }
            void *impl = PyLong_AsVoidPtr(cdata);
            Py_DECREF(cdata);
            all = impl != NULL && *(void **)((char *)probe + candidates[c]) == impl;
        }
        if (all)
            return candidates[c];
    }
    return -1;
}

/* The offset in every probe's TensorImpl where a pointer equal to its storage's ``_cdata`` (its
 * StorageImpl) lies, among the first words; -1 where no one offset holds for every probe. */
static Py_ssize_t find_storage_in_impl(PyObject *probes, PyObject *storages) {
    Py_ssize_t n = PyList_GET_SIZE(probes);
    if (n < 2 || PyList_GET_SIZE(storages) != n)
        return -1;
    for (Py_ssize_t word = 1; word < 32; word++) {
        int all = 1;
        for (Py_ssize_t i = 0; all && i < n; i++) {
            void *impl = *(void **)((char *)PyList_GET_ITEM(probes, i) + cdata_offset);
            void *storage = PyLong_AsVoidPtr(PyList_GET_ITEM(storages, i));
            all = storage != NULL && *(void **)((char *)impl + word * sizeof(void *)) == storage;
        }
        if (all)
            return word * (Py_ssize_t)sizeof(void *);
    }
    PyErr_Clear();
    return -1;
}

/* init(addresses, cdata_descriptor, tensor_type, probes, storages): the shim's functions, in the
 * order of fingerprint.py's SHIM; torch's tensor base class and its ``_cdata``; tensors to find
 * with, and their storages' ``_cdata``. Returns whether records hold each tensor's StorageImpl. */
static PyObject *init(PyObject *self, PyObject *args) {
    PyObject *addresses, *descr, *type, *probes, *storages;
    if (!PyArg_ParseTuple(args, "O!OO!O!O!", &PyTuple_Type, &addresses, &descr, &PyType_Type, &type, &PyList_Type,
                          &probes, &PyList_Type, &storages))
        return NULL;
    if (PyTuple_GET_SIZE(addresses) != 10 || Py_TYPE(descr)->tp_descr_get == NULL) {
        PyErr_SetString(PyExc_ValueError, "init: expected 10 function addresses and a descriptor");
        return NULL;
    }
    void *fns[10];
    for (Py_ssize_t i = 0; i < 10; i++) {
        fns[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(addresses, i));
        if (fns[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "init: a function address is 0");
            return NULL;
        }
    }
    get_data_ptr = (get_ptr_fn)fns[0];
    get_storage_size = (get_i64_fn)fns[1];
    get_storage_offset = (get_i64_fn)fns[2];
    get_dtype = (get_i32_fn)fns[3];
    get_device_type = (get_i32_fn)fns[4];
    get_device_index = (get_i32_fn)fns[5];
    get_dim = (get_i64_fn)fns[6];
    get_sizes = (get_arr_fn)fns[7];
    get_strides = (get_arr_fn)fns[8];
    dtype_element_size = (elem_size_fn)fns[9];
    Py_XDECREF(cdata_descr);
    Py_INCREF(descr);
    cdata_descr = descr;
    Py_XDECREF(tensor_type);
    Py_INCREF(type);
    tensor_type = (PyTypeObject *)type;
    cdata_offset = find_cdata_offset(probes);
    storage_in_impl = cdata_offset >= 0 ? find_storage_in_impl(probes, storages) : -1;
    return PyBool_FromLong(storage_in_impl >= 0);
}

/* record(tensors) -> bytes, or the index of the first tensor whose storage does not hold every
 * byte it spans (freed or shrunk: the caller names it). */
static PyObject *record(PyObject *self, PyObject *arg) {
    if (cdata_descr == NULL)
        return not_ready();
    PyObject *seq = PySequence_Fast(arg, "record: expected a sequence of tensors");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), used = 0, cap = n * (HEAD + 4) + MAX_WORDS;
    int64_t *words = PyMem_Malloc(sizeof(int64_t) * cap);
    if (words == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    PyObject **items = PySequence_Fast_ITEMS(seq), *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (cap - used < MAX_WORDS) {
            cap = 2 * cap;
            int64_t *more = PyMem_Realloc(words, sizeof(int64_t) * cap);
            if (more == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            words = more;
        }
        int64_t end;
        Py_ssize_t k = facts(items[i], words + used, &end);
        if (k < 0)
            goto done;
        if (end > words[used + 1]) {
            result = PyLong_FromSsize_t(i);
            goto done;
        }
        used += k;
    }
    result = PyBytes_FromStringAndSize((const char *)words, sizeof(int64_t) * used);
done:
    PyMem_Free(words);
    Py_DECREF(seq);
    return result;
}

/* same(tensors, recorded) -> bool: the tensors' facts now are ``recorded`` (from record). */
static PyObject *same(PyObject *self, PyObject *args) {
    PyObject *arg;
    Py_buffer recorded;
    if (cdata_descr == NULL)
        return not_ready();
    if (!PyArg_ParseTuple(args, "Oy*", &arg, &recorded))
        return NULL;
    PyObject *seq = PySequence_Fast(arg, "same: expected a sequence of tensors");
    if (seq == NULL) {
        PyBuffer_Release(&recorded);
        return NULL;
    }
    const int64_t *then = recorded.buf;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), left = recorded.len / (Py_ssize_t)sizeof(int64_t);
    PyObject **items = PySequence_Fast_ITEMS(seq), *result = Py_False;
    int64_t now[MAX_WORDS], end;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = facts(items[i], now, &end);
        if (k < 0) {
            result = NULL;
            goto done;
        }
        if (k > left || memcmp(now, then, sizeof(int64_t) * k) != 0)
            goto done;
        then += k;
        left -= k;
    }
    if (left == 0)
        result = Py_True;
done:
    PyBuffer_Release(&recorded);
    Py_DECREF(seq);
    return Py_XNewRef(result);
}

/* same_items(pairs) -> bool: for each (now, then) of ``pairs``, list ``now`` holds the very objects of
 * tuple ``then``, in order (by identity: no item's __eq__ is called, a TE tensor's would compute). */
static PyObject *same_items(PyObject *self, PyObject *pairs) {
    if (!PyTuple_Check(pairs)) {
        PyErr_SetString(PyExc_TypeError, "same_items: expected a tuple of (list, tuple) pairs");
        return NULL;
    }
    for (Py_ssize_t p = 0; p < PyTuple_GET_SIZE(pairs); p++) {
        PyObject *pair = PyTuple_GET_ITEM(pairs, p);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyList_Check(PyTuple_GET_ITEM(pair, 0)) ||
            !PyTuple_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "same_items: expected a tuple of (list, tuple) pairs");
            return NULL;
        }
        PyObject *now = PyTuple_GET_ITEM(pair, 0), *then = PyTuple_GET_ITEM(pair, 1);
        Py_ssize_t n = PyList_GET_SIZE(now);
        if (n != PyTuple_GET_SIZE(then))
            Py_RETURN_FALSE;
        for (Py_ssize_t i = 0; i < n; i++)
            if (PyList_GET_ITEM(now, i) != PyTuple_GET_ITEM(then, i))
                Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"same_items", same_items, METH_O, "same_items(pairs) -> bool: each list holds its tuple's objects, in order."},
    {"init", init, METH_VARARGS, "init(addresses, cdata, tensor_type, probes, storages) -> records hold storages"},
    {"record", record, METH_O, "record(tensors) -> bytes, or the index of a tensor its storage does not hold."},
    {"same", same, METH_VARARGS, "same(tensors, recorded) -> bool: the tensors' facts are those recorded."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fingerprint", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fingerprint(void) { return PyModule_Create(&module); }
