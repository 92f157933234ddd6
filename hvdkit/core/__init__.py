# Framework-neutral core: imports neither torch nor tensorflow.
