# Call 3 (tools/device/prepare.sh), right after run2.sh on the same warm machine: the
# Dockerfile's serve step with Streamlit and its dependencies carried in .gpu/st.
cd "$(dirname "$0")/../.."
. .gpu/common/setup.sh
[ -f /root/partA.bin ] || { echo "NO PART A: a fresh machine"; exit 3; }
[ -f /tmp/pkg/sparsefinder/__init__.py ] || { echo "no installed package: run run2.sh first"; exit 3; }
ST=/tmp/st; [ -f $ST/.ok ] || { mkdir -p $ST && tar xJf .gpu/st/st.tar.xz -C $ST && touch $ST/.ok; }
PYTHONPATH=$PYTHONPATH:$ST python3 -c "import streamlit; print('streamlit', streamlit.__version__)" 2>&1 | tail -1
echo "== serve step $(date +%T)"
R=$PWD; mkdir -p /tmp/srv && cp -r app .streamlit /tmp/srv/ && cd /tmp/srv
PYTHONPATH=/tmp/pkg:$S:$ST timeout 300 python3 $R/.gpu/common/serve_check.py ${SERVE_ARGS:-} 2>&1 | grep -v "Loading weights" | tee $OUT/serve.log
echo "== done $(date +%T)"
