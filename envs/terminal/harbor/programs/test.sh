#!/bin/bash
# Written by `palaestra pack export harbor`: runs the palaestra task's verifier as palaestra
# does ($$VERIFIER_DIR holds its files, cwd is the task's workdir; exit 0 passes) and writes
# Harbor's reward file. A task with reward_file = 1 may write the reward itself. Its
# test-time installs (palaestra's verifier_installs), if any, run first.
export VERIFIER_DIR=/tests/palaestra VERIFIER_LOGS=/logs/verifier
# Helpers an import moved name palaestra's verifier folders ($verifier_dir, $verifier_logs):
# here they are the folders the tests run from.
rm -rf $verifier_dir $verifier_logs
ln -s "$$VERIFIER_DIR" $verifier_dir && ln -s "$$VERIFIER_LOGS" $verifier_logs
REWARD_FILE=$reward_file
mkdir -p "$$VERIFIER_LOGS"
rm -f "$$VERIFIER_LOGS/reward.txt"
cd $workdir || exit 1
${installs}bash "$$VERIFIER_DIR/test.sh"
rc=$$?
if [ "$$REWARD_FILE" = 1 ] && [ -s "$$VERIFIER_LOGS/reward.txt" ]; then
  exit 0
fi
if [ "$$rc" -eq 0 ]; then echo 1; else echo 0; fi > "$$VERIFIER_LOGS/reward.txt"
