"""What a job reads from the network, and getting it before the job goes offline.

    mirror.py   one setting (`assets.mirror`, $MULO_BENCH_MIRROR) that reads every non-hub URL
                from a mirror: an HTTP server or a folder laid out as host/path
    asset.py    one downloadable thing: files of a Hugging Face repo (by pattern), a pinned URL,
                a ModelScope model; its listing (sizes, cached or not), download and fetch command
    fetching.py the assets of a job (prompt set, model, evaluators), `stages=[fetch]`, and the
                offline check that stops a job before generation when something is missing
    decoders.py what the job's decoders read: MuLo-SD's pinned super-resolution network of the
                models' ratio (the `sr` up-sampler), refused by key where none is pinned
"""
