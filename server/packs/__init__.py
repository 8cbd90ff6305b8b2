"""Task packs (DESIGN §6): pack.toml (`manifest`), files and digest (`lock`), reading a
pack folder into tasks (`loader`), the packs served (`catalog`), the published-pack
registry (`registry`) over the on-disk store (`store`), archives (`archive`), what a task
may name (`taskfields`) and what a family must offer the loader (`validator`). `palaestra
pack check` plays a pack through an in-process server: server/packcheck.py."""
