// The static Explorer's script. %(uid)s is replaced by the Explorer's element id.
// Every output was computed in Python when the cell ran; the "-data" script element holds them,
// de-duplicated, with the index of each combination's output (row-major in the controls' order).
// The script only looks an output up: it never re-implements the calculation.
(function(){
var id="%(uid)s", d=JSON.parse(document.getElementById(id+"-data").textContent);
function upd(){var k=0;for(var i=0;i<d.sizes.length;i++){var c=document.getElementById(id+"-c"+i);
var j=parseInt(c.value,10);k=k*d.sizes[i]+j;var o=document.getElementById(id+"-c"+i+"-v");if(o){o.textContent=d.labels[i][j];}}
document.getElementById(id+"-out").innerHTML=d.outputs[d.index[k]];}
for(var i=0;i<d.sizes.length;i++){var c=document.getElementById(id+"-c"+i);c.addEventListener("input",upd);c.addEventListener("change",upd);}
})();
