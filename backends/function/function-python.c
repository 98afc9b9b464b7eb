/* function-python.c - the python3 runtime of the function backend: module _dsec_fnz, loaded into
 * /usr/bin/python3, which becomes the zygote; each forked worker runs one call in the warm
 * interpreter. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backends/function/function-zygote.h"

/*
 * The backend starts the zygote as
 *   /usr/bin/python3 -I -c BOOT DIR ARGS...
 * where BOOT imports this module from DIR and calls _dsec_fnz.main(ARGS),
 * which never returns: it is the zygote (function-zygote.c). Running inside
 * the system interpreter, rather than embedding libpython3.11.so, gives
 * calls the speed of /usr/bin/python3 (PGO, no PIC: ~1.8x faster here) and
 * exactly its sys.executable, sys.path and modules.
 *
 * The launcher below is compiled once in the zygote (as module _dsec_fn,
 * file name "<dsec-fn>") and called once per worker with the decoded task.
 * It reproduces what `python3 ARGS` does where a program can tell: sys.argv,
 * sys.path[0], os.environ, __main__ with __file__, the traceback and exit
 * code 1 of an uncaught exception (without the launcher's own frames),
 * SystemExit codes and messages, non-daemon threads joined and atexit
 * handlers run before exit, exit code 120 when flushing stdout fails.
 *
 * What differs from a cold interpreter (docs/function-calls.md): modules in
 * the preload list are already imported; the hash seed is the zygote's (a
 * rebuilt zygote gets a new one); interpreter finalisation (module teardown,
 * __del__ at shutdown) is skipped: the process exits once stdio is flushed.
 *
 * --call FUNC (our extension): the code is run, then FUNC(*args) is called
 * with each argument decoded as JSON; stdout carries only the JSON encoding
 * of the return value (one line), and whatever FUNC prints goes to stderr.
 */

static const char launcher_src[] =
    "import sys, os, io, gc, json, atexit\n"
    "_HERE = '<dsec-fn>'\n"
    "_WARM = 'def f(x):\\n    return [x, {1: x}]\\nf(1)\\n'\n"
    "def _strip(tb):\n"
    "    while tb is not None and tb.tb_frame.f_code.co_filename == _HERE:\n"
    "        tb = tb.tb_next\n"
    "    return tb\n"
    "def _print_exc(e):\n"
    "    try:\n"
    "        tb = _strip(e.__traceback__)\n"
    "        e.__traceback__ = tb  # the hook prints the exception's own traceback\n"
    "        sys.excepthook(type(e), e, tb)\n"
    "    except BaseException:\n"
    "        pass\n"
    "def _exit_code(e):\n"
    "    c = e.code\n"
    "    if c is None:\n"
    "        return 0\n"
    "    if isinstance(c, int):\n"
    "        return c\n"
    "    try:\n"
    "        print(c, file=sys.stderr)\n"
    "    except BaseException:\n"
    "        pass\n"
    "    return 1\n"
    "def _finish(code):\n"
    "    try:\n"
    "        th = sys.modules.get('threading')\n"
    "        if th is not None:\n"
    "            th._shutdown()\n"
    "    except BaseException as e:\n"
    "        _print_exc(e)\n"
    "    try:\n"
    "        atexit._run_exitfuncs()\n"
    "    except BaseException:\n"
    "        pass\n"
    "    bad = False\n"
    "    for f in (sys.stdout, sys.stderr):\n"
    "        try:\n"
    "            if f is not None:\n"
    "                f.flush()\n"
    "        except BaseException:\n"
    "            bad = True\n"
    "    if bad and code == 0:\n"
    "        code = 120\n"
    "    return code\n"
    "def _main_dict(fname):\n"
    "    d = sys.modules['__main__'].__dict__\n"
    "    if fname is not None:\n"
    "        d['__file__'] = fname\n"
    "        d['__cached__'] = None\n"
    "    return d\n"
    "def _call(co, d, func, args):\n"
    "    out = sys.stdout\n"
    "    sys.stdout = sys.stderr\n"
    "    try:\n"
    "        exec(co, d)\n"
    "        fn = d.get(func)\n"
    "        if not callable(fn):\n"
    "            raise NameError('--call: the code defines no function %r' % (func,))\n"
    "        vals = []\n"
    "        for i, a in enumerate(args):\n"
    "            try:\n"
    "                vals.append(json.loads(a))\n"
    "            except ValueError as e:\n"
    "                raise ValueError('--call: argument %d is not JSON: %s' % (i + 1, e)) from "
    "None\n"
    "        ret = fn(*vals)\n"
    "    finally:\n"
    "        sys.stdout = out\n"
    "    out.write(json.dumps(ret, default=repr))\n"
    "    out.write('\\n')\n"
    "def _set_env(env):\n"
    "    # C's environ already holds exactly these strings: mirror them without putenv\n"
    "    try:\n"
    "        d = os.environ._data\n"
    "        d.clear()\n"
    "        d.update(env)\n"
    "    except Exception:\n"
    "        os.environ.clear()\n"
    "        os.environ.update({k.decode('utf-8', 'surrogateescape'): v.decode('utf-8', "
    "'surrogateescape')\n"
    "                           for k, v in env.items()})\n"
    "def prepare():\n"
    "    # a call's first touches of the interpreter, made before the call comes\n"
    "    _set_env(dict(os.environ._data))\n"
    "    sys.path.insert(0, '')\n"
    "    del sys.path[0]\n"
    "    exec(compile(_WARM, '<string>', 'exec'), {'__name__': '__main__', '__builtins__': "
    "__builtins__})\n"
    "    json.dumps(json.loads('[1, {\"a\": 2.5}]'))\n"
    "    for f in (sys.stdout, sys.stderr):\n"
    "        f.flush()\n"
    "def run(mode, target, argv, env, unbuffered, no_bytecode, call):\n"
    "    _set_env(env)\n"
    "    sys.argv = argv\n"
    "    if no_bytecode:\n"
    "        sys.dont_write_bytecode = True\n"
    "    if unbuffered:\n"
    "        for f in (sys.stdout, sys.stderr):\n"
    "            try:\n"
    "                f.reconfigure(write_through=True)\n"
    "            except Exception:\n"
    "                pass\n"
    "    if mode == 'file':\n"
    "        sys.path.insert(0, os.path.dirname(os.path.realpath(target)))\n"
    "    else:\n"
    "        sys.path.insert(0, '')\n"
    "    gc.enable()\n"
    "    code = 0\n"
    "    try:\n"
    "        if mode == 'module':\n"
    "            import runpy\n"
    "            runpy._run_module_as_main(target, alter_argv=True)\n"
    "        else:\n"
    "            fname = None\n"
    "            if mode == 'code':\n"
    "                co = compile(target, '<string>', 'exec')\n"
    "            elif mode == 'stdin':\n"
    "                co = compile(sys.stdin.read(), '<stdin>', 'exec')\n"
    "            else:\n"
    "                try:\n"
    "                    with io.open_code(target) as f:\n"
    "                        src = f.read()\n"
    "                except OSError as e:\n"
    "                    print(\"%s: can't open file %r: [Errno %d] %s\" % (sys.executable, "
    "target,\n"
    "                          e.errno, e.strerror), file=sys.stderr)\n"
    "                    return _finish(2)\n"
    "                co = compile(src, target, 'exec')\n"
    "                fname = target\n"
    "            d = _main_dict(fname)\n"
    "            if call:\n"
    "                _call(co, d, call, argv[1:])\n"
    "            else:\n"
    "                exec(co, d)\n"
    "    except SystemExit as e:\n"
    "        code = _exit_code(e)\n"
    "    except BaseException as e:\n"
    "        _print_exc(e)\n"
    "        code = 1\n"
    "    return _finish(code)\n";

static PyObject *launcher_run;     /* _dsec_fn.run, owned by the zygote forever */
static PyObject *launcher_prepare; /* _dsec_fn.prepare */

/* The pending exception as text (for start-up errors), then cleared. */
static void exc_msg(const char *what, char *msg, size_t len)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *t = s ? PyUnicode_AsUTF8(s) : NULL;
    snprintf(msg, len, "%s: %s", what, t ? t : "unknown error");
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
}

static int py_warm(const char *preload, char *version, size_t vlen, char *loaded, size_t llen,
                   char *msg, size_t msglen)
{
    snprintf(version, vlen, "python %.*s", (int)strcspn(Py_GetVersion(), " "), Py_GetVersion());
    /* __main__ must look like python3's: the bootstrap's names go. */
    PyObject *main_dict = PyModule_GetDict(PyImport_AddModule("__main__"));
    PyObject *keys = main_dict ? PyDict_Keys(main_dict) : NULL;
    for (Py_ssize_t i = 0; keys != NULL && i < PyList_GET_SIZE(keys); i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        const char *name = PyUnicode_Check(k) ? PyUnicode_AsUTF8(k) : NULL;
        if (name != NULL && strncmp(name, "__", 2) != 0)
            PyDict_DelItem(main_dict, k);
    }
    Py_XDECREF(keys);
    PyErr_Clear();

    /* The interpreter is the node's; its standard library must be in the
     * root it now runs in (an environment's root may have another one, or
     * none). */
    PyObject *os_mod = PyImport_ImportModule("os");
    PyObject *os_file = os_mod ? PyObject_GetAttrString(os_mod, "__file__") : NULL;
    const char *os_path = os_file && PyUnicode_Check(os_file) ? PyUnicode_AsUTF8(os_file) : NULL;
    if (os_path == NULL || access(os_path, R_OK) != 0) {
        snprintf(msg, msglen,
                 "no standard library (%s): python3 is the node's python %.*s; use runtime "
                 "sh or native for an environment's own programs",
                 os_path ? os_path : "standard library", (int)strcspn(Py_GetVersion(), " "),
                 Py_GetVersion());
        Py_XDECREF(os_file);
        Py_XDECREF(os_mod);
        PyErr_Clear();
        return -1;
    }
    Py_XDECREF(os_file);
    Py_XDECREF(os_mod);

    /* The launcher's own needs first, then the preload list. */
    static const char *const needed[] = {"os", "io", "gc", "json", "atexit", "runpy"};
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++) {
        PyObject *m = PyImport_ImportModule(needed[i]);
        if (m == NULL) {
            exc_msg(needed[i], msg, msglen);
            return -1;
        }
        Py_DECREF(m);
    }
    loaded[0] = '\0';
    size_t used = 0;
    const char *p = preload;
    while (*p) {
        size_t n = strcspn(p, ",");
        char name[128];
        if (n > 0 && n < sizeof name) {
            memcpy(name, p, n);
            name[n] = '\0';
            PyObject *m = PyImport_ImportModule(name);
            if (m == NULL) {
                PyErr_Clear(); /* not installed here: skip it */
            } else {
                Py_DECREF(m);
                int w = snprintf(loaded + used, llen - used, "%s%s", used ? "," : "", name);
                if (w > 0 && (size_t)w < llen - used)
                    used += (size_t)w;
            }
        }
        p += n;
        if (*p == ',')
            p++;
    }

    PyObject *code = Py_CompileString(launcher_src, "<dsec-fn>", Py_file_input);
    PyObject *mod = code ? PyImport_ExecCodeModuleEx("_dsec_fn", code, "<dsec-fn>") : NULL;
    Py_XDECREF(code);
    launcher_run = mod ? PyObject_GetAttrString(mod, "run") : NULL;
    launcher_prepare = mod ? PyObject_GetAttrString(mod, "prepare") : NULL;
    Py_XDECREF(mod);
    if (launcher_run == NULL || launcher_prepare == NULL) {
        exc_msg("compiling the launcher", msg, msglen);
        return -1;
    }
    /* The launcher's path once here, so what it creates or caches on first
     * use (the type attribute cache, codec and encoder state) is in the
     * shared image rather than made again, page by page, in every call. */
    PyObject *w = PyObject_CallNoArgs(launcher_prepare);
    if (w == NULL) {
        exc_msg("warming the launcher", msg, msglen);
        return -1;
    }
    Py_DECREF(w);
    /* Workers share the zygote's pages until they write them. Reference
     * counting writes wherever a worker goes, but a collection would walk
     * (and write) every object: move them all out of the collector's reach.
     * Each worker re-enables collection for its own objects. (In a scratch
     * namespace: __main__ stays pristine.) */
    PyObject *ns = PyDict_New();
    PyObject *r = NULL;
    if (ns != NULL && PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins()) == 0)
        r = PyRun_String("import gc, sys\n"
                         "sys.stdout.flush(); sys.stderr.flush()\n"
                         "gc.collect(); gc.disable(); gc.freeze()\n",
                         Py_file_input, ns, ns);
    Py_XDECREF(ns);
    if (r == NULL) {
        exc_msg("freezing the heap", msg, msglen);
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

static PyObject *str_list(char *const *v, size_t n)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l != NULL && i < n; i++) {
        PyObject *s = PyUnicode_DecodeFSDefault(v[i]);
        if (s == NULL) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, s);
    }
    return l;
}

/* {bytes: bytes}: os.environ's own representation of C's environ. */
static PyObject *env_dict(char *const *env)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d != NULL && env[i] != NULL; i++) {
        const char *eq = strchr(env[i], '=');
        if (eq == NULL || eq == env[i])
            continue;
        PyObject *k = PyBytes_FromStringAndSize(env[i], eq - env[i]);
        PyObject *v = PyBytes_FromString(eq + 1);
        if (k == NULL || v == NULL || PyDict_SetItem(d, k, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return d;
}

static void py_prepare(int from, int to)
{
    if (from < 1 && to >= 1)
        PyOS_AfterFork_Child();
    if (from >= 2 || to < 2)
        return;
    PyObject *r = PyObject_CallNoArgs(launcher_prepare);
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
}

static int py_run(const struct fnz_task *t, int prepared)
{
    if (prepared < 1)
        PyOS_AfterFork_Child();
    const struct fnp_task *h = t->hdr;
    const char *mode = h->mode == FNP_MODE_PY_CODE     ? "code"
                       : h->mode == FNP_MODE_PY_FILE   ? "file"
                       : h->mode == FNP_MODE_PY_MODULE ? "module"
                                                       : "stdin";
    PyObject *argv = str_list(t->argv, h->argc);
    PyObject *env = env_dict(t->env);
    PyObject *target = PyUnicode_DecodeFSDefault(t->target);
    PyObject *call = (h->flags & FNP_TASK_PY_CALL) ? PyUnicode_FromString(t->call_func)
                                                   : (Py_INCREF(Py_None), Py_None);
    PyObject *r = NULL;
    if (argv != NULL && env != NULL && target != NULL && call != NULL)
        r = PyObject_CallFunction(launcher_run, "sOOOiiO", mode, target, argv, env,
                                  (h->flags & FNP_TASK_PY_UNBUFFERED) != 0,
                                  (h->flags & FNP_TASK_PY_NO_BYTECODE) != 0, call);
    int code = 1;
    if (r == NULL) {
        PyErr_Print();
    } else {
        long c = PyLong_AsLong(r);
        code = c == -1 && PyErr_Occurred() ? 1 : (int)c;
        Py_DECREF(r);
    }
    fflush(stdout);
    fflush(stderr);
    return code;
}

static const struct fnz_runtime python_runtime = {
    .warm = py_warm,
    .prepare = py_prepare,
    .run = py_run,
};

/* _dsec_fnz.main(args): become the zygote. Returns only on a usage error. */
static PyObject *mod_main(PyObject *self, PyObject *args)
{
    PyObject *list;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &list))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list);
    char **argv = PyMem_Calloc((size_t)n + 1, sizeof *argv);
    if (argv == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(list, i);
        const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
        if (s == NULL) {
            PyMem_Free(argv);
            return PyErr_Format(PyExc_TypeError, "_dsec_fnz.main: argument %zd is not a string", i);
        }
        argv[i] = (char *)s;
    }
    int rc = fnz_main((int)n, argv, &python_runtime);
    PyMem_Free(argv);
    return PyLong_FromLong(rc);
}

static PyMethodDef mod_methods[] = {
    {"main", mod_main, METH_VARARGS, "Become the zygote of the dsec function backend."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef mod_def = {
    PyModuleDef_HEAD_INIT,
    "_dsec_fnz",
    "The zygote of the dsec function backend.",
    -1,
    mod_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__dsec_fnz(void);

PyMODINIT_FUNC PyInit__dsec_fnz(void)
{
    return PyModule_Create(&mod_def);
}
