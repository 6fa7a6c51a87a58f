#!/bin/bash
# usage: udpcheck2.sh N — send N datagrams NS1 -> NS2 (198.19.0.21:5555) once the receiver is bound
R=/tmp/udpcheck.ready; rm -f $R
ip netns exec ${NS2:-lanes-h2-c1} python3 -c '
import socket
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.bind(("198.19.0.21",5555)); s.settimeout(5.0)
open("'$R'","w").close()
n=0
try:
    while True: s.recv(2000); n+=1
except Exception: pass
print("received",n)' &
for i in $(seq 1 600); do [ -e $R ] && break; sleep 0.1; done
ip netns exec ${NS1:-lanes-h1-c1} python3 -c '
import socket,time
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
for i in range('$1'):
    s.sendto(b"x"*64,("198.19.0.21",5555))
    if i%50==0: time.sleep(0.001)
'
wait
