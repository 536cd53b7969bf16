#!/usr/bin/env bash
# Build the HTML book (executing every notebook) and say where to open it.
# Usage: bash scripts/book.sh                the public book: each exercise is its student copy
#        bash scripts/book.sh --instructor   the instructors' book: the exercises with solutions (folded)
# (JOBS=N sets how many notebooks run at once; default: the CPU count, at most 2)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") instructor=0 ;;
  --instructor) instructor=1 ;;
  *) echo "usage: bash scripts/book.sh [--instructor]" >&2; exit 2 ;;
esac
bash scripts/setup.sh
. .venv/bin/activate
# Warnings are errors; a failing cell fails the build (nb_execution_raise_on_error).
# Progress bars are silent in the static pages (lessonlib.progress).
export LESSONLIB_STATIC_BUILD=1
# One thread per library, as scripts/test.sh runs the notebooks: two pages run at once.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
# The notebooks execute while Sphinx reads them, so reading them in parallel
# (`sphinx-build -j`; every extension of the book is parallel-safe) runs that
# many notebooks at once. `jupyter-book build` has no such switch: it writes its
# Sphinx configuration from _config.yml (`jupyter-book config sphinx`: a conf.py
# that lives only for the build; .gitignore names it), then sphinx-build runs
# with it as `jupyter-book build --all -W -n --keep-going` would. Sphinx reads in
# parallel only when every extension says it may, and reports one that says
# nothing as a warning: sphinx_jupyterbook_latex (jupyter-book adds it for PDF
# builds) has nothing to do in HTML and goes; sphinx_multitoc_numbering and
# sphinx-mathjax-offline say nothing, and are safe (the first numbers sections
# after all pages are read, the second copies MathJax when the build ends).
cpus=$(getconf _NPROCESSORS_ONLN)  # (nproc would follow OMP_NUM_THREADS)
JOBS=${JOBS:-$(( cpus < 2 ? cpus : 2 ))}
# The public book is built from a copy of the sources (_build/src) whose exercise notebooks are
# their student copies, rendered without running (scripts/student_pages.py); the instructors'
# book from the sources themselves.
if [ "$instructor" = 1 ]; then
  src=.
  trap 'rm -f conf.py' EXIT
else
  src=_build/src
  python scripts/student_pages.py "$src"
fi
jupyter-book config sphinx "$src" >/dev/null
cat >> "$src/conf.py" <<'PY'
extensions = [e for e in extensions if e != "sphinx_jupyterbook_latex"]
def setup(app):
    for name in ("sphinx_multitoc_numbering", "sphinx-mathjax-offline"):
        if name in app.extensions:
            app.extensions[name].parallel_read_safe = app.extensions[name].parallel_write_safe = True
    # Sphinx reads the pages in chunks of consecutive names, $JOBS chunks at a time (about 15 pages
    # a chunk here), so one chunk of long pages could run alone at the end. One page a chunk lets
    # each process take the next page as soon as it is free (a chunk costs a fork and one pickled
    # environment, well under a second). The long pages should start first, so that the last to
    # start are short: the chapters before the exercises (the shortest notebooks), the last chapter
    # first (its pages start processes), the Markdown pages last. (The public book does not run the
    # exercises: they are student copies, rendered as written.) Sphinx starts the first $JOBS
    # chunks at once and then, as a process frees, the chunk added last (ParallelTasks takes the
    # waiting ones with dict.popitem()), so the rest are handed over in reverse.
    import sphinx.builders
    def one_page_a_chunk(docnames, nproc, maxbatch=10):
        chunks = [[d] for d in docnames]
        return chunks[:nproc] + chunks[nproc:][::-1]
    sphinx.builders.make_chunks = one_page_a_chunk
    def longest_first(app, env, docnames):
        docnames.sort(reverse=True)
        docnames.sort(key=lambda d: (not str(env.doc2path(d)).endswith(".ipynb"), d.startswith("exercises/")))
    app.connect("env-before-read-docs", longest_first)
PY
rm -rf _build/html
sphinx-build -b html -E -a -j "$JOBS" -W -n --keep-going -d _build/.doctrees "$src" _build/html
echo
[ "$instructor" = 1 ] && kind="instructors' book (exercises with solutions: not for students)" || kind="public book"
echo "The $kind is built. Open: file://$PWD/_build/html/index.html"
