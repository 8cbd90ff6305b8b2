"""Every file of the tree and its size in bytes."""
SIZES = {
    "logs/app.log": 50000,
    "logs/old/app.log.1": 10241,
    "logs/old/app.log.2": 10240,
    "logs/debug.txt": 9000,
    "cache/.hidden/blob.bin": 20480,
    "cache/index": 100,
    "media/My Song.mp3": 30000,
    "media/cover.jpg": 10239,
    "media/clips/intro clip.mov": 12000,
    "README": 12,
    "build/out.o": 64000,
    "build/tmp/empty": 0,
    "Zeta.dat": 11111,
}
