
# -- appended by palaestra (envs/terminal/envimage.py) -------------------------------------
# The sandbox mounts a fresh workspace over the workdir, which hides what the build put
# there: keep a readable copy outside it; the terminal family copies it in at reset.
ARG PALAESTRA_WORKDIR=/app
USER root
RUN mkdir -p "$PALAESTRA_WORKDIR" /.palaestra-env/workdir \
    && cp -a "$PALAESTRA_WORKDIR"/. /.palaestra-env/workdir/ \
    && chmod -R a+rX /.palaestra-env
