"""The command line, `python -m ampc <command>`, on top of the library: main (the arguments, and
each command's modules loaded only when it runs), doctor, demo (ampc's runs and the table),
demo_torch (--compare-torch's rows), demo_distributed (--distributed), workloads (the models, data
and training step both libraries' runs share), progress (tqdm's bar per run) and plot (--plot's
PNG, matplotlib). Nothing in the library imports it."""
