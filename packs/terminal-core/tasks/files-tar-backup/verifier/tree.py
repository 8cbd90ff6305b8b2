"""The files of /work/project; `keep` says whether they belong in the backup."""
FILES = {
    "README.md": True,
    "src/main.py": True,
    "src/util.py": True,
    "src/__pycache__/util.cpython-311.pyc": False,
    "src/sub/__pycache__/x.pyc": False,
    "src/sub/helpers.py": True,
    "node_modules/left-pad/index.js": False,
    "web/node_modules/react/index.js": False,
    "web/app.js": True,
    "web/build.log": False,
    "logs/server.log": False,
    "logs/server.log.txt": True,
    "docs/changelog.md": True,
    "docs/.nojekyll": True,
    "node_modules.txt": True,
}
